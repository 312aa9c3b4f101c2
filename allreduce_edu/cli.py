"""`allreduce-edu lessons | demo | bench | launch | site`: the package from a terminal."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from . import bench, course
from .bench.demo import demo
from .collectives import ALGORITHMS, DESCRIPTIONS
from .comm.window import TRANSPORTS as WINDOW_TRANSPORTS
from .runtime import launch, limits
from .runtime.cluster import TRANSPORTS
from .runtime.limits import check_world_size
from .runtime.rules import check
from .version import __version__


def lessons(args, parser) -> int:
    """`allreduce-edu lessons [DIR]`: the learner's own copy, then JupyterLab in it; or the
    instructor's key."""
    if args.solved:
        if (Path(args.solved) / course.MANIFEST).exists():
            parser.error(f"{args.solved} is a learner's lessons folder: write the key elsewhere")
        print(f"Writing the instructor's key to {args.solved} (every lesson executed with its "
              f"answers; a few minutes)...", flush=True)
        results = course.write_solved(args.solved)
        for name, problems, skipped in results:
            verdict = (f"skipped, it {skipped}" if skipped
                       else "; ".join(problems) if problems else "every checker ✓")
            print(f"  {name}: {verdict}")
        return 1 if any(problems for _, problems, _ in results) else 0
    try:
        check("lessons DIR", args.dir)
        report = course.copy_lessons(args.dir, args.reset)
    except ValueError as e:
        parser.error(str(e))
    print(report, flush=True)
    if args.no_lab:
        return 0
    command = [sys.executable, "-m", "jupyterlab",
               f"--ServerApp.root_dir={Path(args.dir).resolve()}"]
    command += ["--no-browser"] * args.no_browser + ([f"--port={args.port}"] if args.port else [])
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # containers and CI run as root; JupyterLab refuses it unless told
        command.append("--allow-root")
    print(f"Opening JupyterLab in {args.dir} (Ctrl-C stops it; your lessons stay there).",
          flush=True)
    if os.name == "nt":  # Windows' exec starts a new process and ends this one: wait instead
        return subprocess.call(command)
    # JupyterLab takes this process's place: Ctrl-C and kill reach it
    os.execv(sys.executable, command)


def _typed(convert, what: str):
    """An argparse type: `convert(text)`, with its ValueError turned into a one-line usage error."""
    def parse(text):
        try:
            return convert(text)
        except (ValueError, TypeError) as e:
            raise argparse.ArgumentTypeError(str(e) if "must be" in str(e) else f"{what}: {e}") \
                from None
    parse.__name__ = what
    return parse


def _at_least(low: int):
    def check(text):
        value = int(text)
        if value < low:
            raise ValueError(f"must be >= {low}, got {value}")
        return value
    return check


def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values:
        raise ValueError("give comma-separated integers, e.g. 256,1024")
    return values


POSITIVE, COUNT = _typed(_at_least(1), "a number >= 1"), _typed(_at_least(0), "a number >= 0")
SIZE = _typed(bench.parse_size, "a size")
LIMIT = {"type": POSITIVE, "metavar": "N",
         "help": "allow more ranks than this machine is judged to hold"}


class Parser(argparse.ArgumentParser):
    """argparse, with every usage error on one line (exit 2) and the way to the full help."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> Parser:
    parser = Parser(prog="allreduce-edu", description=__doc__)
    parser.add_argument("--version", action="version", version=f"allreduce-edu {__version__}")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{lessons,demo,bench,launch,site}")
    parser.commands = sub.choices  # name -> its parser, for errors found after parsing

    p = sub.add_parser("lessons", help="copy the lessons into a folder of your own and open them "
                                       "in JupyterLab",
                       description="Copy the course's lessons into DIR (never over a lesson you "
                                   "changed) and open JupyterLab there. Run it again for new or "
                                   "updated lessons.")
    p.add_argument("dir", nargs="?", default=course.DEFAULT_FOLDER,
                   help=f"your lessons folder (default: ./{course.DEFAULT_FOLDER})")
    p.add_argument("--reset", metavar="NN", action="append", default=[],
                   help="put a fresh copy of lesson NN beside yours (NN_..._fresh.ipynb); "
                        "repeatable")
    p.add_argument("--solved", metavar="KEY_DIR",
                   help="instead: write the instructor's key (every exercise answered, executed) "
                        "there")
    p.add_argument("--no-lab", action="store_true",
                   help="only copy the lessons; do not start JupyterLab")
    p.add_argument("--no-browser", action="store_true",
                   help="start JupyterLab without opening a browser")
    p.add_argument("--port", type=POSITIVE, help="JupyterLab's port (default: its own choice)")

    p = sub.add_parser("demo", help="run every algorithm on real ranks and check it against NumPy")
    p.add_argument("-n", "--world-size", type=POSITIVE, default=4, help="ranks (default 4)")
    p.add_argument("--count", type=COUNT, default=1 << 18, help="float32 elements per rank")
    p.add_argument("--transport", choices=TRANSPORTS, default="grpc", help="default grpc")
    p.add_argument("--max-ranks", **LIMIT)

    p = sub.add_parser("bench", help="nccl-tests style all-reduce benchmark "
                                     "(--op layernorm: the fused operator)")
    p.add_argument("-n", "--world-size", type=POSITIVE, default=4, help="ranks (default 4)")
    p.add_argument("--op", choices=("allreduce", "layernorm"), default="allreduce",
                   help="allreduce: the algorithms table; "
                        "layernorm: reduce_layernorm_broadcast's variants")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="--op layernorm --device cuda: the GPU's norm kernels (lesson 14)")
    p.add_argument("--rows", type=_typed(_ints, "rows"), default=[256, 1024, 4096],
                   help="--op layernorm: comma-separated row counts")
    p.add_argument("--hidden", type=_typed(_ints, "hidden"), default=[1024, 4096],
                   help="--op layernorm: comma-separated hidden sizes")
    p.add_argument("--algorithm", default="",
                   help=f"comma-separated, from {', '.join(ALGORITHMS)} (default: every one the "
                        f"transport runs; one_shot and two_shot need shm or local)")
    p.add_argument("--transport", choices=TRANSPORTS, default="grpc", help="default grpc")
    p.add_argument("-b", "--minbytes", type=SIZE, default=8,
                   help="smallest size, e.g. 8, 64K (default 8)")
    p.add_argument("-e", "--maxbytes", type=SIZE, default=64 << 20,
                   help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=_typed(_at_least(2), "a factor >= 2"), default=4,
                   help="multiply the size by this between rows (default 4)")
    p.add_argument("--iters", type=POSITIVE, default=20,
                   help="timed iterations per row (default 20)")
    p.add_argument("--warmup", type=COUNT, default=5, help="untimed iterations first (default 5)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64", "int32", "int64"),
                   help="element type (default float32)")
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--peer", action="append", choices=("gloo", "mpi"), default=[],
                   help="also time this engine's own all-reduce in the same run "
                        "(extras [torch], [mpi])")
    p.add_argument("--links", metavar="ALPHA,BANDWIDTH",
                   help="emulated links, one full-duplex port per rank, e.g. 10ms,100MB/s: the "
                        "model's time (the links' own and fitted on them) beside each row")
    p.add_argument("--testbed", action="store_true",
                   help="the course's testbed: shm ranks on its emulated links (--links to change)")
    p.add_argument("--topology", metavar="NODESxRANKS", help="emulated cluster, e.g. 2x2 (sets -n)")
    p.add_argument("--intra-link", default="5us,10GB/s",
                   help="with --topology: latency,bandwidth in a node")
    p.add_argument("--inter-link", default="2ms,50MB/s",
                   help="with --topology: latency,bandwidth between nodes")
    p.add_argument("--max-ranks", **LIMIT)

    p = sub.add_parser("launch", help="run a script on N ranks, like torchrun (several machines: "
                                      "--nnodes, --node-rank, --rendezvous)")
    launch.add_arguments(p)
    p.add_argument("--max-ranks", **LIMIT)
    p = sub.add_parser("site", help="the lessons as web pages whose animations play without a "
                                    "kernel, from disk")
    p.add_argument("dir", nargs="?", default="allreduce-edu-site",
                   help="where to write the pages (default: ./allreduce-edu-site)")
    p.add_argument("--lesson", metavar="NN", action="append", default=[],
                   help="only lesson NN (repeatable; default: every lesson)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "lessons":
        return lessons(args, parser.commands["lessons"])
    if args.command == "site":
        from .course import (
            site,  # nbformat and the widgets' pages: only the command that needs them
        )

        try:
            return site.command(args)
        except ValueError as e:  # no such lesson
            parser.commands["site"].error(str(e))
    try:  # every bad value: one line, exit 2, before anything starts
        run = plan(args)
    except ValueError as e:
        parser.commands[args.command].error(str(e))
    try:
        return run()
    except KeyboardInterrupt:
        print(f"allreduce-edu {args.command}: interrupted; every rank it started was stopped",
              file=sys.stderr)
        return 130


def plan(args):
    """Check every argument (ValueError names the bad one), then return the run as a callable."""
    if getattr(args, "max_ranks", None):  # reaches every Cluster and launch this run starts
        os.environ[limits.ENV] = str(args.max_ranks)
    if args.command == "launch":
        check_world_size(args.nproc_per_node, True, what="-n")
        launch.check_arguments(args)
        return lambda: launch.run_from_args(args)
    if args.command == "demo":
        check_world_size(args.world_size, TRANSPORTS[args.transport].processes, what="-n")
        return lambda: 0 if demo(args.world_size, args.count, transport=args.transport) else 1
    if args.op == "layernorm":
        if args.dtype not in ("float32", "float64"):
            raise ValueError(f"--op layernorm needs --dtype float32 or float64, got {args.dtype}")
        if min(args.hidden) < 1 or min(args.rows) < 0:
            raise ValueError(f"--rows takes counts >= 0 and --hidden sizes >= 1, "
                             f"got {args.rows}, {args.hidden}")
        if args.device == "cuda":  # one GPU's kernels, no ranks; refused on the simulator
            from .bench import gpu
            return gpu.plan(args.rows, args.hidden, args.dtype)
        check_world_size(args.world_size, TRANSPORTS[args.transport].processes, what="-n")
        from .bench import fused
        return lambda: fused.report(args.world_size, args.transport, args.rows, args.hidden,
                                    args.dtype, args.iters, args.warmup)
    if args.device == "cuda":
        raise ValueError("--device cuda times the norm kernels: add --op layernorm")
    windows = args.transport in WINDOW_TRANSPORTS  # one_shot and two_shot need them
    algorithms = ([a.strip() for a in args.algorithm.split(",") if a.strip()] if args.algorithm
                  else [a for a in ALGORITHMS if windows or DESCRIPTIONS[a].needs != "windows"])
    unknown = [a for a in algorithms if a not in ALGORITHMS]
    if unknown or not algorithms:
        raise ValueError(f"unknown algorithm(s) {', '.join(unknown) or repr(args.algorithm)}; "
                         f"valid: {', '.join(ALGORITHMS)}")
    windowless = [a for a in algorithms if DESCRIPTIONS[a].needs == "windows" and not windows]
    if windowless:
        raise ValueError(f"{', '.join(windowless)} run on symmetric windows, which the "
                         f"{args.transport} transport has not: use --transport shm")
    if args.minbytes > args.maxbytes:
        raise ValueError(f"-b {args.minbytes} is larger than -e {args.maxbytes}: "
                         f"the sizes run from -b up to -e")
    sizes = bench.sweep(args.minbytes, args.maxbytes, args.stepfactor)
    if args.json:
        check("--json", args.json)  # before the run, not after it
    links = None
    if args.testbed or args.links:
        from .runtime.testbed import TESTBED
        if args.topology:
            raise ValueError("--links/--testbed are one level of links: drop --topology")
        links = check("--links", args.links) if args.links else TESTBED
        args.transport = "shm" if args.testbed else args.transport
    if args.topology:
        from .model.links import Links, parse_topology
        nodes, per_node = parse_topology(args.topology)
        links = check("--links", Links.two_level(per_node, args.intra_link, args.inter_link))
        args.world_size = nodes * per_node
    if links is not None and args.peer:
        raise ValueError("--peer times an engine's own network: "
                         "it cannot cross the emulated --topology or --links")
    check_world_size(args.world_size, TRANSPORTS[args.transport].processes, what="-n")
    check("-e", args.maxbytes, args.world_size)  # the largest message, on every rank
    return lambda: bench.command(args, algorithms, sizes, links)


if __name__ == "__main__":
    sys.exit(main())
