"""Tests of the command-line tools (mrc.cli). A package, so pytest imports these modules as
cli.test_recv_output and so on: the one name under which the tests that share a helper import
it, and the one mypy checks them by."""
