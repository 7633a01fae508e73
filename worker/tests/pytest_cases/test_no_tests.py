"""A module with no test in it: pytest collects nothing."""


def helper():
    return 1
