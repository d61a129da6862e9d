// Stands in for the CUDA header of this name when the CUDA provider builds over the emulated device.
#pragma once
#include "../cuda_emu.h"
