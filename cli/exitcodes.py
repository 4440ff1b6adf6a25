"""Exit codes: one per outcome a CI pipeline must tell apart. Documented in `mpt --help` and README."""

OK = 0
INTERNAL = 1  # a bug in mpt: please report it
USAGE = 2  # bad option, config, list file, plan or checkpoint; a model file or function that is not there
TARGET_NOT_MET = 3  # tune found no plan within tolerance / check: plan no longer meets its target
USER_CODE = 4  # the user's model file raised (import, build_model, evaluate, example_inputs)
INTERRUPTED = 130  # Ctrl-C or SIGTERM; finished trials are kept in the journal

HELP = f"""\b
Exit codes:
  {OK}    success
  {TARGET_NOT_MET}    target not met (tune: no plan within tolerance; check: plan fails)
  {USAGE}    bad usage, config, op list, plan or checkpoint; model file or function not found
  {USER_CODE}    error in your model file (import, build_model, evaluate)
  {INTERRUPTED}  interrupted (Ctrl-C / SIGTERM)
  {INTERNAL}    internal error in mpt (run with --debug and report it)"""
