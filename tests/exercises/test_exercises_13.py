"""Lesson 13's checkers. 13.1: the right DDP hook passes; the sum instead of the mean, the bucket
unchanged, gloo instead of the ring, N written as a number (the checker runs 3, then 2 ranks), no
future or a future never completed fail, naming the bucket, step and rank. 13.2: the right gradient sync passes; forgetting it, syncing half of it, or
averaging fails, naming the parameter and the step where the ranks (or one process) disagree."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import cluster_for

from allreduce_edu import allreduce, course
from allreduce_edu.exercises import reference
from allreduce_edu.exercises.lesson13 import check_ddp_hook, check_norm_grad_sync, drift, no_sync
from allreduce_edu.training.pytorch import have_torch

needs_torch = pytest.mark.skipif(not have_torch(), reason="torch is not installed")


def check(fn, world_size=3):
    """The checker on the session's cluster of this size (the lesson's starts its own)."""
    return check_norm_grad_sync(fn, cluster=cluster_for("grpc", world_size))


def both_at_once(comm, grad_weight, grad_bias):
    import numpy as np

    both = allreduce(comm, np.concatenate([grad_weight, grad_bias]))
    return both[:len(grad_weight)], both[len(grad_weight):]


def weight_only(comm, grad_weight, grad_bias):
    return allreduce(comm, grad_weight), grad_bias


def averaged(comm, grad_weight, grad_bias):
    n = comm.world_size
    return allreduce(comm, grad_weight) / n, allreduce(comm, grad_bias) / n


def wrong_shape(comm, grad_weight, grad_bias):
    return allreduce(comm, grad_weight)[:3], allreduce(comm, grad_bias)


def my_sync_norm_grads(comm, grad_weight, grad_bias):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


@pytest.mark.processes
@needs_torch
def test_right_answers_pass():
    assert check_norm_grad_sync(reference("13.2"))  # on ranks of its own, as in the lesson
    assert check(both_at_once, world_size=2)


@pytest.mark.processes
@needs_torch
def test_the_missing_all_reduce_is_named_with_its_step():
    feedback = check(no_sync)
    assert not feedback and feedback.status == "failed"
    assert "layernorm.weight differs between rank 0 and rank 1 from step 1" in feedback.message
    half = check(weight_only)
    assert not half and "layernorm.bias differs between rank 0 and rank 1 from step 1" \
        in half.message


@pytest.mark.processes
@needs_torch
def test_averaging_agrees_across_ranks_but_not_with_one_process():
    feedback = check(averaged)
    assert not feedback and "the same on every rank but differs from one-process" \
        in feedback.message
    assert "0.33× the right one" in feedback.message and "did you average" in feedback.message


@pytest.mark.processes
@needs_torch
def test_errors_are_reported():
    broken = check(wrong_shape, world_size=2)
    assert not broken and "my_sync_norm_grads raised" in broken.message


def test_the_scaffold_is_not_attempted_with_or_without_torch(monkeypatch):
    assert check_norm_grad_sync(my_sync_norm_grads).status == "not attempted"
    monkeypatch.setattr("allreduce_edu.exercises.lesson13.have_torch", lambda: False)
    feedback = check_norm_grad_sync.demo(reference("13.2"))
    assert feedback.status == "check failed" and 'pip install -e ".[torch]"' in feedback.message


@pytest.mark.processes
def test_the_lesson_runs_clean_without_torch(tmp_path, monkeypatch):
    """Every torch cell says what it needs and skips; nothing raises (torch hidden from the
    kernel and its ranks by a sitecustomize that blocks the import)."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    lesson = course.source_folder() / "13_pytorch.ipynb"
    ran = course.execute(course.read(lesson), lesson.parent, timeout=120)
    assert course.errors(ran) == []
    printed = ["".join(o.get("text", "")) for c in ran["cells"] for o in c.get("outputs", [])]
    skipped = [p for p in printed if 'skipped: this cell needs PyTorch: pip install -e ".[torch]"'
               in p]
    torch_cells = [c for c in ran["cells"] if "torch_ready()" in course.source(c)]
    assert len(skipped) == len(torch_cells) > 8
    feedback = course.feedback(course.exercise_cells(ran)["13.1"])
    assert "not attempted yet" in feedback
    assert "not attempted yet" in course.feedback(course.exercise_cells(ran)["13.2"])


@pytest.mark.processes
@needs_torch
def test_drift_grows_without_the_all_reduce_and_is_zero_with_it():
    cluster = cluster_for("grpc", 3)
    apart = drift(cluster, no_sync, steps=4)
    assert all(w > 0 and b > 0 for w, b in apart)
    assert apart[-1][0] > apart[0][0]  # further apart with every step
    assert drift(cluster, reference("13.2"), steps=3) == [(0.0, 0.0)] * 3


# --- 13.1: the DDP hook ----------------------------------------------------------------------
def summed(state, bucket):
    import torch

    future = torch.futures.Future()
    future.set_result(torch.from_numpy(state.ring(state.comm, bucket.buffer().detach().numpy())))
    return future


def unchanged(state, bucket):
    import torch

    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def through_gloo(state, bucket):
    import torch
    import torch.distributed as dist

    grads = bucket.buffer()
    dist.all_reduce(grads)
    future = torch.futures.Future()
    future.set_result(grads / state.comm.world_size)
    return future


def gloo_and_a_token_ring(state, bucket):
    """gloo averages the bucket; the ring carries one number, so bytes go over the wire."""
    state.ring(state.comm, np.zeros(1))
    return through_gloo(state, bucket)


def no_future(state, bucket):
    return state.ring(state.comm, bucket.buffer().detach().numpy())


def never_completed(state, bucket):
    import torch

    return torch.futures.Future()


def my_ddp_hook(state, bucket):
    """The scaffold as the lesson ships it."""
    ...  # your code here, in place of `...`


def check_hook(fn, **kwargs):
    """13.1's checker on the session's clusters of 3, then 2 (the lesson's starts its own)."""
    return check_ddp_hook(fn, cluster=cluster_for("grpc", 3), also=cluster_for("grpc", 2),
                          **kwargs)


def divides_by_three(state, bucket):
    """The solution with N written as the 3 of the checker's first run."""
    import torch

    total = state.ring(state.comm, bucket.buffer().detach().numpy())
    future = torch.futures.Future()
    future.set_result(torch.from_numpy(total / 3))
    return future


@pytest.mark.processes
@needs_torch
def test_a_world_size_written_as_a_number_is_refused():
    """3 ranks cannot tell `/ 3` from `/ state.comm.world_size`; the second run, on 2, does."""
    feedback = check_hook(divides_by_three)
    assert not feedback and feedback.status == "failed", feedback
    assert "right on 3 ranks, but the checker also runs one step on 2 ranks" in feedback.message
    assert "on rank 0, bucket 0 of step 0 came back as the sum divided by 3, but this run has 2 " \
        "ranks" in feedback.message


@pytest.mark.processes
@needs_torch
def test_the_hook_through_the_ring_passes():
    feedback = check_hook(reference("13.1"), ring=reference("03.1"))
    assert feedback and "all 5 buckets of 3 steps" in feedback.message


@pytest.mark.processes
@needs_torch
def test_wrong_hooks_are_named_with_bucket_step_and_rank():
    summed_up = check_hook(summed)
    assert not summed_up and "bucket 0 of step 0 came back as the sum over the 3 ranks" \
        in summed_up.message
    kept = check_hook(unchanged)
    assert not kept and "this rank's own gradients, unchanged" in kept.message
    gloo = check_hook(through_gloo)
    assert not gloo and "sent no byte through its communicator" in gloo.message
    token = check_hook(gloo_and_a_token_ring)  # bytes on the wire, but not the buckets'
    assert not token and "Most buckets did not travel through your ring" in token.message


@pytest.mark.processes
@needs_torch
def test_a_hook_without_a_completed_future_is_reported():
    plain = check_hook(no_future)
    assert not plain and "my_ddp_hook failed on rank" in plain.message \
        and "needs a torch.futures.Future" in plain.message
    waiting = check_hook(never_completed, deadline=1.0)
    assert not waiting and "nothing called its set_result" in waiting.message


def test_the_hook_scaffold_is_not_attempted_with_or_without_torch(monkeypatch):
    assert check_ddp_hook(my_ddp_hook).status == "not attempted"
    monkeypatch.setattr("allreduce_edu.exercises.lesson13.have_torch", lambda: False)
    feedback = check_ddp_hook.demo(reference("13.1"))
    assert feedback.status == "check failed" and 'pip install -e ".[torch]"' in feedback.message
