"""The one error type of mixprec.

Every failure a user can cause raises :class:`MixprecError`. Its message says
what is wrong and how to fix it, in the style of onnx-graphsurgeon's errors.
The CLI prints it on one line and exits 2; pages show it with ``st.error``.
"""
from __future__ import annotations


class MixprecError(Exception):
    """A problem the user can fix. ``what`` says what is wrong, ``fix`` how to fix it."""

    def __init__(self, what: str, fix: str = "", *, details: list[str] | None = None):
        self.what = what.rstrip(".")
        self.fix = fix.rstrip(".")
        self.details = list(details or [])
        super().__init__(self.message)

    @property
    def message(self) -> str:
        msg = self.what + "."
        if self.details:
            shown = self.details[:20]
            more = len(self.details) - len(shown)
            msg += " Offending entries: " + "; ".join(shown)
            if more > 0:
                msg += f"; … and {more} more"
            msg += "."
        if self.fix:
            msg += " Fix: " + self.fix + "."
        return msg

    def __str__(self) -> str:  # noqa: D401
        return self.message

    def __reduce__(self):  # from a trial worker process to its pool: with its fix and details
        return _restore, (type(self), self.what, self.fix, self.details)


def _restore(cls, what: str, fix: str, details: list[str]) -> MixprecError:
    e = cls.__new__(cls)
    MixprecError.__init__(e, what, fix, details=details)
    return e
