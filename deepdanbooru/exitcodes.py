"""The exit codes of every command and script (standard library only)."""

OK = 0
# The command ran to the end, but its answer is "not all good": a preflight check failed, an image was
# skipped, a converted model did not match Keras.
FAILED = 1
# Bad usage or bad input: one error line naming the file and field (errors.UserError).
USAGE = 2
INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as shells report it
BROKEN_PIPE = 141  # the reader of the output went away (`| head`): 128 + SIGPIPE, as shells report it
