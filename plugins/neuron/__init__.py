"""AWS Neuron (Inferentia, Trainium): ring and 2D-torus device topologies."""
