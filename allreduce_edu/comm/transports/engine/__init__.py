"""Another engine's point-to-point as a transport: the package's algorithms over MPI or
torch.distributed (lesson 09).

    communicator.py   EngineCommunicator: our messages as (header, payload) pairs on an engine
    mpi.py            MPICommunicator over mpi4py (extra `[mpi]`)
    torch_dist.py     TorchCommunicator over torch.distributed's gloo (extra `[torch]`)

Neither mpi4py nor torch is imported until its module is.
"""
