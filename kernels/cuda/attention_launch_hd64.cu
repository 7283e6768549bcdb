// The launchers and kernels of head dims 64/64 (q·k/v, padded: attention_config.h), bf16 and fp16.
#include "kernels/cuda/attention_launch_kernels.cuh"

HARNESS_ATTENTION_LAUNCHERS(64, 64)
