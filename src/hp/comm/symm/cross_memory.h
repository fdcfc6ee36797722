// Single-copy reads from (and writes to) a peer process's private memory (Linux
// cross-memory attach, process_vm_readv and process_vm_writev): a collective whose data
// sits in ordinary buffers then moves each byte once, straight from the sender's buffer
// into the receiver's, instead of twice through a shared window.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hp::symm {

// Copies `bytes` at address `remote` of process `pid` into `local`. False if the kernel
// refuses (no permission to read that process, or no such address); never partial.
bool read_peer(int64_t pid, uint64_t remote, void* local, size_t bytes);

// The other way: copies `bytes` at `local` to address `remote` of process `pid`.
bool write_peer(int64_t pid, uint64_t remote, const void* local, size_t bytes);

// Lets this process's peers use the two calls above on it where Yama restricts ptrace to
// a process's ancestors (ptrace_scope 1, Ubuntu's default): a group's ranks are siblings,
// so the launcher's descendants (peer_tracer()) are allowed, and no other process. A no-op
// without Yama.
void allow_peer_access();

// Whose descendants may read this process: $HP_LAUNCHER_PID (hprun's pid), else the parent
// (torchrun's agent, mpirun's daemon and Slurm's step daemon each start a node's ranks
// as their children). Ranks as threads of one process need nothing.
int64_t peer_tracer();

}  // namespace hp::symm
