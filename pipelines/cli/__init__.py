"""The `pipeline` command (`main`): the Typer app and how a user mistake becomes one line
(`app`), and the commands by what they act on: a spec (`spec`), runs (`run`), a
catalog (`catalog`), policies and models (`models`). Imports every room below it."""
