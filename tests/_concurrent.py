"""Running test workers at once: each job in its own thread, all released together."""
import threading
from typing import Any, Callable, Iterable


def at_once(work: Callable[..., Any], jobs: Iterable[tuple[Any, ...]]) -> None:
    """Call ``work(*job)`` for every job, each in its own thread, all starting together (a barrier), and re-raise the
    first failure after all have finished."""
    jobs = list(jobs)
    start = threading.Barrier(len(jobs))
    errors: list[BaseException] = []

    def run(*job: Any) -> None:
        start.wait()
        try:
            work(*job)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
