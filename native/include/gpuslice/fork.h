/* Fork-child handlers: one list, run in a forked child before it makes any other call of ours.
 *
 * A module that keeps per-process state (a lock another thread of the parent may have held at the
 * fork, books of the parent's allocations, the parent's devices) names its reset with
 * GS_ON_FORK_CHILD(fn) at file scope. The linker gathers every such entry into one table (the
 * section gs_fork_child); the start-up module (src/core/init.c) owns the list: once the enforcer
 * is active it runs the table from its one pthread_atfork child handler.
 *
 * Why a table the linker fills rather than calls: start-up must not name the modules that depend
 * on it (the hooks and the accounting call start-up, so start-up calling them back made a circle),
 * and nothing may run at load time (no constructors: a process that never touches CUDA pays
 * nothing). The entries are plain data; the handlers run in an unspecified order, so each resets
 * only its own module. */
#ifndef GPUSLICE_FORK_H
#define GPUSLICE_FORK_H

typedef void (*gs_fork_child_fn)(void);

/* aligned: the linker places the entries of all files one after another, so each must be exactly
 * one pointer; `used`: nothing names the entry, the compiler must keep it anyway. (Sanitizers
 * leave variables in named sections unpadded, for this very use.) */
#define GS_ON_FORK_CHILD(fn)                                                                        \
    static const gs_fork_child_fn gs_on_fork_child_##fn                                             \
        __attribute__((used, section("gs_fork_child"), aligned(sizeof(gs_fork_child_fn)))) = (fn)
#endif
