"""The forgetting harness on the GPU machine (no network, no BERT package there): what it needs, in
two carries of a device call each (a call carries at most 64 MiB; the converted model is 91 MB).

    here:   .venv/bin/python scripts/gpu/forgetting_pack.py pack     # -> .fgpack0/, .fgpack1/ (git-ignored)
    there:  device call 1 carry [".fgpack0"], call 2 carry [".fgpack1"]: run.sh's forgetting stage
            unpacks them (python3 scripts/gpu/forgetting_pack.py unpack) into forgetting-out/

``pack`` reads forgetting-out/ after one run.py call per task has converted the model and prepared
the data here (``make forgetting-report`` does it); ``unpack`` checks the model's sha256 and gives
model.pt its mtime back, so that verify.json and each task's baseline.json (the plain-BERT check,
which needs the package) are read instead of recomputed.
"""

import hashlib
import json
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORK = os.environ.get("RECADAM_FORGETTING_WORK", os.path.join(ROOT, "forgetting-out"))
PACK_DIR = os.environ.get("RECADAM_FGPACK_DIR", ROOT)  # where .fgpack0/1 go (the tests: a temporary dir)
PACKS = [os.path.join(PACK_DIR, ".fgpack0"), os.path.join(PACK_DIR, ".fgpack1")]
DATA = ("data", "data-tweets", "data-nli")  # every task's prepared files (multi links to them)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pack():
    model = os.path.join(WORK, "pretrained", "model.pt")
    missing = [p for p in [model] + [os.path.join(WORK, d, "baseline.json") for d in DATA] if not os.path.isfile(p)]
    if missing:
        sys.exit(f"forgetting_pack.py: error: {', '.join(missing)} missing: run `make forgetting-report` here first")
    for p in PACKS:
        shutil.rmtree(p, ignore_errors=True)
        os.makedirs(p)
    st = os.stat(model)
    half = st.st_size // 2
    with open(model, "rb") as f:
        for p, part in zip(PACKS, (f.read(half), f.read())):
            with open(os.path.join(p, "model.pt.part"), "wb") as out:
                out.write(part)
    shutil.copytree(os.path.join(WORK, "pretrained"), os.path.join(PACKS[0], "pretrained"),
                    ignore=shutil.ignore_patterns("model.pt"))
    for d in DATA:  # the glue/ layouts are links run.py makes again
        shutil.copytree(os.path.join(WORK, d), os.path.join(PACKS[0], d), ignore=shutil.ignore_patterns("glue"))
    with open(os.path.join(PACKS[0], "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"sha256": sha256(model), "size": st.st_size, "mtime_ns": st.st_mtime_ns}, f)
    for p in PACKS:
        size = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(p) for n in ns)
        print(f"{p}: {size / 2**20:.1f} MiB")


def unpack():
    with open(os.path.join(PACKS[0], "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    parts = [os.path.join(p, "model.pt.part") for p in PACKS]
    if not all(os.path.isfile(p) for p in parts):
        sys.exit("forgetting_pack.py: error: carry .fgpack0 and .fgpack1 (one device call each) before this stage")
    os.makedirs(WORK, exist_ok=True)
    for name in os.listdir(PACKS[0]):
        src = os.path.join(PACKS[0], name)
        if os.path.isdir(src):
            shutil.copytree(src, os.path.join(WORK, name), dirs_exist_ok=True)
    model = os.path.join(WORK, "pretrained", "model.pt")
    with open(model, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                shutil.copyfileobj(f, out)
    if sha256(model) != manifest["sha256"]:
        sys.exit(f"forgetting_pack.py: error: {model}: sha256 differs from the packed model's (pack again)")
    os.utime(model, ns=(manifest["mtime_ns"], manifest["mtime_ns"]))
    print(f"unpacked the converted model ({manifest['size']} bytes, sha256 checked) and {', '.join(DATA)} into {WORK}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv not in (["pack"], ["unpack"]):
        sys.exit("usage: forgetting_pack.py pack|unpack")
    pack() if argv[0] == "pack" else unpack()


if __name__ == "__main__":
    main()
