#!/bin/sh
# Prints the path of the newest supported Python on this machine (3.12, then 3.11), for the Makefile.
# fairseq-fixed ships a binary wheel for CPython 3.12; on 3.11 pip compiles it (about 5 minutes).
# A pyenv shim (e.g. python3.12 when 3.12 is installed but not selected) exists on PATH yet refuses
# to run, so every candidate is tried by running it, and pyenv's installed versions are asked directly.
for v in 3.12 3.11; do
  cands="python$v"
  if command -v pyenv >/dev/null 2>&1; then
    prefix=$(pyenv prefix "$v" 2>/dev/null | head -n1)
    [ -n "$prefix" ] && cands="$cands $prefix/bin/python$v"
    root=$(pyenv root 2>/dev/null)
    [ -n "$root" ] && cands="$cands $(ls -d "$root"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V -r)"
  fi
  for p in $cands; do
    # It must run, be that version and be able to make a venv (Debian splits venv into python3.x-venv).
    if "$p" -c "import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != tuple(map(int, '$v'.split('.'))))" \
        >/dev/null 2>&1; then
      command -v "$p" 2>/dev/null || echo "$p"
      exit 0
    fi
  done
done
echo "scripts/find_python.sh: no usable Python 3.12 or 3.11 found; run make with PYTHON=/path/to/python3.12" >&2
exit 1
