"""The bottom layer every room shares: the error hierarchy (`common.errors`) and how
config fields are declared (`common.config`). It imports nothing of ours."""
