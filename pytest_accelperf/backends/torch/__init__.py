"""The PyTorch backends, one module a part:

* ``backend``: the ``torch`` backend (one process, one device, eager or compiled);
  ``on_device``: its device and its step as the measured-step loop runs it; ``stepper``:
  its A/B stepper (blocks of steps on demand); ``flops``: the FLOPs (and dispatched ops)
  of one counted call of a step;
* ``step``: the step API (``TorchStep``), ``task``: ``TorchTask`` and the helpers DDP and
  DeepSpeed share with it (import the step API from :mod:`pytest_accelperf.torch`);
* ``memory``: the CPU memory count (MemTracker; the backend's counted steps, memory growth,
  out-of-memory records) and CUDA's peaks; ``ops``: an eager step's
  aten ops; ``program``: the program record (FLOPs, ops, what dynamo compiled);
* ``ranks``: DDP's and DeepSpeed's ranks from the parent's side (the plan, the launch or the Ray
  actors, the run made of what the ranks return); ``in_rank``: what runs inside a rank (the plan it
  is shipped, its loop); ``rank_step``: their step API (``RankStep``, ``Built``); ``comm``: what a
  rank communicates per step; ``ddp``: DistributedDataParallel (``torch`` with ``world_size > 1``);
  ``deepspeed``: DeepSpeed ZeRO;
* ``neuron``: torch-xla on Trainium / Inferentia.

Importing this package imports no framework; its submodules import torch.
"""
