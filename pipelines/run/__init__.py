"""The run room: the runner that executes a plan step by step (`runner`, `steps`), the
hooks around it (`hooks`) and what they drive: progress on the terminal (`progress`),
early warnings of collapse (`watch`), experiment trackers (`tracking`); the Ray session
and its signals (`session`). Imports `pipelines.spec`, `graph` and `report`."""
