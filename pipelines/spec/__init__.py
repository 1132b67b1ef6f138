"""The spec room: YAML files (with `extends:` presets and `-o` overrides) in, one
typed, checked and frozen `Spec` out, every value with the file or override that set it;
`explain` prints them. Imports no other room of `pipelines`."""
