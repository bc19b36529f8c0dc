"""Built-in device plugins; each registers through the same entry points a third-party plugin uses."""
