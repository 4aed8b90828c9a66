"""The PyTorch backends: torch (``backend``), DDP (``ddp``), DeepSpeed (``deepspeed``),
torch-xla on Neuron (``neuron``)."""
