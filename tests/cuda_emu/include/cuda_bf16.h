// Stands in for the CUDA header of this name when kernels/cuda/*.cu compile for cuda_emu.
#pragma once
#include "../cuda_emu.h"
