"""``python -m recadam_fairseq --user-dir``: print the directory to pass to fairseq's ``--user-dir``."""

import argparse
import os


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recadam_fairseq", description=__doc__)
    parser.add_argument("--user-dir", action="store_true", help="print the --user-dir path of this installation")
    args = parser.parse_args(argv)
    if not args.user_dir:
        parser.print_help()
        return 2
    print(os.path.dirname(os.path.abspath(__file__)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
