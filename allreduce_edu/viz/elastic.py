"""Pictures of a chaos run (lesson 15): each replica slot's steps coloured by quorum id, the
deaths, the healing transfers; and the loss curves beside a run without failures."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D


def plot_chaos_timeline(result, ax) -> None:
    """Seconds since the run began on x, replica slots on y: every committed step a tick in its
    quorum's colour, every failed try a grey x, every death a red X, every heal an arrow from
    the slot that sent the state."""
    colours = plt.get_cmap("tab10")
    slot_of = {r["replica_id"]: r["slot"] for r in result.records}
    for r in result.records:
        t, slot = r["t"] - result.t0, r["slot"]
        if r["committed"]:
            ax.plot([t, t], [slot - 0.3, slot + 0.3], color=colours(r["quorum_id"] % 10), lw=1.5)
        else:
            ax.plot(t, slot, "x", color="grey", ms=6)
        if r["healing"] and r["healed_from"] in slot_of:
            src = slot_of[r["healed_from"]]
            ax.annotate("", (t, slot), (t, src), arrowprops={"arrowstyle": "->", "color": "k",
                                                             "lw": 1.2})
            ax.text(t, (slot + src) / 2, "heal", fontsize=7, va="center", ha="center",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1})
    for replica_id, _, phase, t in result.deaths:
        slot = slot_of.get(replica_id)
        if slot is not None:
            ax.plot(t - result.t0, slot, "X", color="red", ms=11)
            ax.text(t - result.t0 + 0.02, slot - 0.4, f"{replica_id} killed ({phase})",
                    fontsize=7, color="red")
    first: dict[int, float] = {}  # when each quorum id was first formed
    for t, quorum_id, _ in result.quorums:
        first.setdefault(quorum_id, t)
    for quorum_id, t in first.items():
        ax.axvline(t - result.t0, color=colours(quorum_id % 10), ls=":", lw=1)
        ax.text(t - result.t0, -0.95, f" quorum {quorum_id}", fontsize=8,
                color=colours(quorum_id % 10))
    handles = [Line2D([], [], color="k", lw=1.5, label="a committed step (colour: quorum id)"),
               Line2D([], [], marker="x", ls="", color="grey", label="a try not committed"),
               Line2D([], [], marker="X", ls="", color="red", label="SIGKILL")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8,
              frameon=False)
    slots = sorted(set(slot_of.values()))
    ax.set_yticks(slots, [f"slot {s}" for s in slots])
    ax.set_ylim(max(slots) + 0.7, -1.1)
    ax.set_xlabel("seconds since the first step")


def quorum_path(result) -> np.ndarray:
    """The committed step each computed step served, in order: a failed try is a step computed
    again (the quorum run's x axis in plot_loss_curves)."""
    failed = {r["step"] for r in result.records if not r["committed"]}
    return np.array([s for s in range(result.steps) for _ in range(1 + (s in failed))])


def restart_path(steps: int, schedule, checkpoint_every: int) -> np.ndarray:
    """The step each computed step of the restart run served: from the last checkpoint to the
    kill, again and again, then to the end (as elastic.restart runs it)."""
    path, start = [], 0
    for kill in sorted((k for k in schedule if k.phase != "heal"), key=lambda k: k.step):
        path.extend(range(start, max(kill.step, start)))
        start = max(start, kill.step // checkpoint_every * checkpoint_every)
    return np.array(path + list(range(start, steps)))


def plot_loss_curves(axes, reference, curves: dict) -> None:
    """One panel per curve {title: (path, losses)}: the loss of every step computed, in the
    order computed (`path`: which step each served), beside `reference` (no failures)."""
    for ax, (title, (path, losses)) in zip(axes, curves.items(), strict=True):
        ax.plot(np.arange(len(reference)), reference, color="grey", lw=3, alpha=0.5,
                label="no failures")
        ax.plot(np.arange(len(path)), np.asarray(losses)[path], lw=1.2, label=title)
        for i in np.flatnonzero(np.diff(path) < 1):  # a step computed again: lost work
            ax.axvline(i + 1, color="red", ls=":", lw=1)
        ax.set_xlabel("steps computed (redone ones too)")
        ax.set_title(f"{title}: {len(path)} steps computed", fontsize=10)
        ax.legend(fontsize=8, frameon=False)
    axes[0].set_ylabel("loss (red: work lost to a kill)")
