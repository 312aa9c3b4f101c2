"""`allreduce-edu bench` (the all-reduce table), its arguments already checked by cli.py: the
package's algorithms on a cluster, then the peers' own all-reduce in the same run.
"""

from __future__ import annotations

from ..runtime import Cluster
from ..trace import format_bytes
from .allreduce import add_predictions, format_p2p, format_table, peer_rows, run, write_json
from .links import fit


def command(args, algorithms, sizes, links) -> int:
    """`allreduce-edu bench`, its arguments checked: the table, then the peers' rows."""
    with Cluster(args.world_size, transport=args.transport, links=links) as cluster:
        print(f"# allreduce-edu bench: {args.world_size} ranks over {args.transport}, "
              f"dtype {args.dtype}, iters {args.iters}, warmup {args.warmup}"
              + (f"; emulated links: {links}" if links else ""), flush=True)
        p2p, rows = run(cluster, algorithms, sizes, args.dtype, args.iters, args.warmup)
        # one level of links: α, β fitted on them too (the gap is the transport's own cost)
        fitted = fit(cluster) if links is not None and links.uniform is not None else None
        if fitted is not None:
            print(f"# fitted on these links: {fitted}", flush=True)
    for peer in args.peer:  # the engine's own all-reduce, on as many processes, in this same run
        try:
            rows += peer_rows(peer, args.world_size, sizes, args.dtype, args.iters,
                                    args.warmup)
        except Exception as e:  # noqa: BLE001 - a missing or failing engine costs its rows, not the run
            print(f"# {peer}: not measured: {type(e).__name__}: {str(e).splitlines()[0]}",
                  flush=True)
    if links:
        add_predictions(rows, links, fitted)
    print(format_p2p(p2p))
    print(format_table(rows))
    ring = [r for r in rows if r["algorithm"] == "ring"]
    if ring and p2p.get("bandwidth_gbps") and not links:
        top = max(ring, key=lambda r: r["bytes"])
        print(f"# ring at {format_bytes(top['bytes'])}: busbw {top['busbw_gbps']:.3f} GB/s = "
              f"{top['busbw_gbps'] / p2p['bandwidth_gbps']:.2f}x the point-to-point bandwidth "
              f"above ({args.transport}'s own ceiling, measured in this run)")
    if args.json:
        write_json(args.json, rows)
    wrong = sum(r["wrong"] for r in rows)
    print(f"# out of bounds values: {wrong} {'OK' if not wrong else 'FAILED'}")
    return 1 if wrong else 0
