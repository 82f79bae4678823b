#pragma once
// Stop requests by signal (`--exit-signal-handler`): the handler only records
// that the signal came; the training loop polls stop_requested() between
// iterations.
//
// The handler runs on an alternate signal stack on every compute thread. That
// is not optional here: Debian 12's oneDNN (2.7) JIT f32 GEMM kernels point
// rsp into a heap workspace while they run, so a signal delivered on the
// ordinary stack writes its frame (about 3 KB with AVX-512 state) over heap
// memory and malloc aborts later ("corrupted size vs. prev_size"; oneDNN
// issue 4845, fixed upstream by its pull request 4855).

namespace mt {

// Installs the handler for `signo` (SA_RESTART | SA_ONSTACK) and gives the
// calling thread and every thread of the OpenMP pool (at its current size)
// an alternate signal stack. Call after set_num_threads().
void install_stop_signal_handler(int signo);

// True once a signal installed above has arrived.
bool stop_requested();

// Clears the request (tests).
void clear_stop_request();

// Gives the calling thread an alternate signal stack unless it has one.
void ensure_signal_stack();

}  // namespace mt
