"""Tests of the sans-IO core (mrc.core, mrc.wire, mrc.lab.sim). A package, so module names
such as test_malformed do not collide with test files elsewhere under tests/."""
