def test_the_umask_is_read_without_setting_it(monkeypatch):
    """Issue 93: reading the umask by setting it is not thread-safe (two first commits at
    once could each read the other's temporary value). Linux says it in /proc."""
    import os
    import subprocess
    import sys

    from catalog import fs

    truth = int(subprocess.run([sys.executable, "-c", "import os; print(os.umask(0))"], capture_output=True,
                               text=True, check=True).stdout)  # fmt: skip
    fs._umask.cache_clear()
    monkeypatch.setattr(os, "umask", lambda *a: (_ for _ in ()).throw(AssertionError("umask set")))
    try:
        assert fs._umask() == truth
    finally:
        fs._umask.cache_clear()
