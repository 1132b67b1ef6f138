"""The report room: what a catalog's runs say, read back: the HTML report (`page`,
`template`, `summary`), the differences between two runs (`diff`) and a stored policy
scored on fresh seeds (`scoring`). Imports `pipelines.spec` only."""
