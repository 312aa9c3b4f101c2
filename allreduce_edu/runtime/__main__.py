"""`python -m allreduce_edu.runtime FOLDER`: one rank of run_on_engine, from mpirun or launch."""

import sys

from .worker import EngineStart, main

main(EngineStart(sys.argv[1]))
