"""A model that runs out of memory on demand, for the tests of what a failed decode step leaves."""


class Flaky:
    """A student's model that fails as a device out of memory does, once ``armed``: any forward of more than
    ``rows`` rows (``decode_only``: of a decode step's one token per row), recording each failed call's shape."""

    def __init__(self, model, rows: int, decode_only: bool = False) -> None:
        self.model, self.rows, self.decode_only, self.armed, self.failures = model, rows, decode_only, False, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, input_ids=None, **kw):
        if self.armed and input_ids.shape[0] > self.rows and (input_ids.shape[1] == 1 or not self.decode_only):
            self.failures.append(tuple(input_ids.shape))
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.model(*args, input_ids=input_ids, **kw)
