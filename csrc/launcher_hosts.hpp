// What the launcher's environment says about a job's hosts, read before any rank has heard
// from another: a ucx group guesses that its ranks share one host (and leaves TCP out of its
// worker, transports/ucx/ucx_context.h) unless the launcher says the job spans hosts. A wrong
// guess costs a second worker and Store round at creation (csrc/transport_backend.cpp), never
// a failed group; this only spares a job that is known to span hosts that detour. Torch-free.
#pragma once

namespace ucxb {

// True when a launcher put fewer ranks on this host than the job has, or fewer than
// `groupSize`: torchrun (LOCAL_WORLD_SIZE, WORLD_SIZE) or Open MPI's mpirun
// (OMPI_COMM_WORLD_LOCAL_SIZE, OMPI_COMM_WORLD_SIZE). False where neither says (no launcher,
// or one that does not tell) and where the job's ranks all run here.
bool launcherSpansHosts(int groupSize);

}  // namespace ucxb
