"""GPU readings behind one interface: ``backend`` (the ``GpuBackend`` protocol, ``GpuReading``,
``GpuUnavailable``, the shared init-and-retry), NVIDIA's NVML (``nvml``, the only module that calls
pynvml), AMD's amdsmi (``amdsmi``), a fake for tests and the demo (``fake``), and the choice of one
from the options (``backends``)."""
