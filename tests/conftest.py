"""Test-wide settings: hypothesis judges properties, not speed (no per-example deadline on a shared CPU); SIGINT as
a terminal's foreground job has it, whatever the test run inherited."""

import signal

from hypothesis import settings

settings.register_profile("rollcut", deadline=None)
settings.load_profile("rollcut")

# A test run started in the background of a non-interactive shell (`pytest ... &`, nohup in a script) inherits SIGINT
# ignored, and an ignored signal stays ignored across exec: every `run.py` a Ctrl-C test starts would ignore the
# SIGINT it is sent while its own handler is not installed yet (Python installs its KeyboardInterrupt handler only
# where SIGINT was not ignored), and the test would fail for how it was launched. Restored here, the children start
# with SIGINT at its default, as under a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
