"""lab_plugin_example: what a researcher's own package adds to lab, without editing lab.

`plugin` is what the entry point in pyproject.toml names: lab adds `conf/` (this package's config
groups, laid out like lab/conf) to Hydra's search path and `ExampleKnobs` to its knobs, for
run.py, `lab run`, `lab serve` and `LLM(...)` alike.
"""

from lab.config.plugins import Plugin
from lab_plugin_example.knobs import ExampleKnobs

plugin = Plugin("example", config="pkg://lab_plugin_example.conf", knobs=ExampleKnobs)
