// The launchers and kernels of real head dims up to 96 (q·k and v): the 128/128 tiles, their head-dim
// sums over 96 columns (sums_96_columns, attention_config.h), bf16 and fp16.
#include "kernels/cuda/attention_launch_kernels.cuh"

HARNESS_ATTENTION_LAUNCHERS_SUMMING(128, 128, 96, 96)
