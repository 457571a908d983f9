"""Driving a callable from many threads at once, as a server's worker pool does (issue 31)."""

import threading

import torch


def threaded(fn, inputs, *, rounds: int, threads: int = 8) -> dict:
    """Call `fn` from `threads` threads released at once, thread t on inputs t, t + threads, ... (`rounds` times
    over); returns the (input index, output) pairs, the exceptions and the number of calls."""
    barrier = threading.Barrier(threads)
    outputs, exceptions, lock = [], [], threading.Lock()

    def work(t: int) -> None:
        mine = range(t % len(inputs), len(inputs), threads) if len(inputs) > threads else [t % len(inputs)]
        barrier.wait()
        for _ in range(rounds):
            for i in mine:
                try:
                    with torch.no_grad():
                        out = fn(inputs[i])
                except Exception as e:  # counted, not raised: every thread's failures are reported
                    with lock:
                        exceptions.append(repr(e))
                else:
                    with lock:
                        outputs.append((i, out))

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(timeout=300)
    return {"outputs": outputs, "exceptions": exceptions, "calls": len(outputs) + len(exceptions)}
