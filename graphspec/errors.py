"""User-facing errors. Each says what is wrong and, where possible, how to fix it; the CLI prints
them as one line without a traceback."""


class GraphspecError(Exception):
    """Base class of every error caused by user input rather than by a bug in graphspec."""


class CheckpointError(GraphspecError):
    """A checkpoint directory is missing, incomplete, corrupt or of an unsupported architecture."""


class InputError(GraphspecError, ValueError):
    """A generate/compile argument is invalid (prompt, token ids, lengths, K, buckets, ...). A ValueError,
    so callers that catch ValueError for bad arguments catch it too."""


class ArtifactError(GraphspecError):
    """A compiled artifact is missing, corrupt, or was built for another device or software stack."""


class PassError(GraphspecError):
    """A compiler pass failed; the message names the pass, the passes before it and the last dump."""
