// The launchers and kernels of head dims 192/192 (q·k/v, padded: attention_config.h), bf16 and fp16.
#include "kernels/cuda/attention_launch_kernels.cuh"

HARNESS_ATTENTION_LAUNCHERS(192, 192)
