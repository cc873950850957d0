# Runs test_* functions and reports in the format of sympy's bin/test (-C --verbose):
# "test_name ok|F|E" lines, then "____ path.py:test_name ____" headers for each failure.
import importlib.util
import sys
import traceback

path = sys.argv[1]
spec = importlib.util.spec_from_file_location("mod", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
print("============================= test process starts ==============================")
print(path + "[%d]" % sum(1 for n in dir(mod) if n.startswith("test_")))
failures = []
for name in sorted(n for n in dir(mod) if n.startswith("test_")):
    try:
        getattr(mod, name)()
        print(f"{name} ok")
    except AssertionError:
        print(f"{name} F")
        failures.append((name, traceback.format_exc()))
    except Exception:
        print(f"{name} E")
        failures.append((name, traceback.format_exc()))
for name, tb in failures:
    print(f"________________ {path[:-3]}.py:{name} ________________")
    print(tb)
print(f"= tests finished: {len(failures)} failed =")
sys.exit(1 if failures else 0)
