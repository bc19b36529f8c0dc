"""AWS Neuron devices and NeuronCores (Inferentia rings, Trainium tori).

The names both sides share live here; `scheduler.py` places pods, `topology.py` holds the pure placement rule,
`device.py` the node side.
"""

from __future__ import annotations

NAME = "neuron"
NEURON = "aws.amazon.com/neuron"
NEURONDEVICE = "aws.amazon.com/neurondevice"
NEURONCORE = "aws.amazon.com/neuroncore"
RESOURCES = [NEURON, NEURONDEVICE, NEURONCORE]
