"""``python -m envs.served``: serve the registered environments (`envs.served.main`).

A package's ``__main__``, so that the command does not run the module ``envs`` already
imported a second time (runpy's RuntimeWarning)."""

from envs.served import main

main()
