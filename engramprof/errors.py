"""One exception type for bad input and unusable environments.

Commands raise UserError with a one-line message; the CLI prints it as ``engramprof: <msg>``
and exits with ``code`` (2 for bad arguments/input, 1 for environment problems), never with a
traceback.
"""


class UserError(Exception):
    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code
