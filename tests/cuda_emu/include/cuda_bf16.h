// Stands in for the CUDA header of this name over the emulated device (cuda_emu.h).
#pragma once
#include "../cuda_emu.h"
