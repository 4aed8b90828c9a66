import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("b", "/work/main/benchmarks/bisect_commits.py")
b = importlib.util.module_from_spec(spec); sys.modules["b"] = b; spec.loader.exec_module(b)
line = "        x = torch.randn(case.batch, DIM, generator=g)\n"
shas = b.build(Path("/tmp/bis/repo"), framework="torch", plant=(line, line + "        time.sleep(0.006)\n"), at=11, commits=16)
print(shas[0], shas[-1])
