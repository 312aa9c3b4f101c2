"""Training on the collectives: what the all-reduce is for.

    data_parallel   a NumPy MLP trained data-parallel, gradient buckets (lesson 08)
    sharded/        ZeRO-1/2/3 and overlapped communication (lessons 11, 12)
    compress/       fewer bytes on the wire: fp16, bf16, fp8, PowerSGD, 1-bit (lesson 17)
    elastic/        training through failures, torchft style (lesson 15)
    pytorch/        PyTorch's DDP hook and tensor parallelism on our collectives (lesson 13)

`from allreduce_edu import training` gives data_parallel's names.
"""

from .data_parallel import (
    MLP,
    allreduce_gradients,
    bucket,
    bucket_layout,
    comm_buffers,
    data_parallel_step,
    finite_difference,
    global_batch,
    loss_and_grads,
    make_dataset,
    seconds_per_step,
    sgd_step,
    shard,
    softmax_cross_entropy,
    train_data_parallel,
    train_single,
    unbucket,
)

__all__ = ["MLP", "allreduce_gradients", "bucket", "bucket_layout", "comm_buffers",
           "data_parallel_step", "finite_difference", "global_batch", "loss_and_grads",
           "make_dataset", "seconds_per_step", "sgd_step", "shard", "softmax_cross_entropy",
           "train_data_parallel", "train_single", "unbucket"]
