"""Transports that need more than one module: the shared-memory one (shm/)."""
