// Whether this process can make CUDA tensors at all, for choices made before any tensor is
// seen (transport_factory.cpp: which transport carries a one-host group). Its own header so
// that those choices need none of c10's headers.
#pragma once

namespace ucxb {

// True where torch has a CUDA (or ROCm) runtime loaded and it counts at least one device:
// torch.cuda.is_available()'s answer, without Python. It asks the runtime for its device count
// (which loads the driver, as torch's check does) but makes no context.
bool cudaDeviceVisible();

}  // namespace ucxb
