# Shared by finetune.sh and multitask.sh (sourced): asking Python, fp16, the architecture, the run directory.
# The caller sets SCRIPT_DIR, PYTHON, DRY_RUN and defines die() and note().

# The script's header comment (everything up to `set -euo pipefail`): its usage; then, for a script that takes a
# METHOD (METHODS_OF set: empty for finetune.sh, --multitask, --seq2seq), the catalogue's METHODs and their variables.
usage() {
  sed -n '2,/^set -euo pipefail/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  if [ -n "${METHODS_OF+set}" ]; then
    local train=${FAIRSEQ_TRAIN:-fairseq-train}
    echo
    "${PYTHON:-$(python_of "${train%% *}")}" "$SCRIPT_DIR/prelaunch.py" methods $METHODS_OF ||
      echo "(python -m recadam_fairseq methods lists them)"
  fi
}

# The Python that runs fairseq-train: the first word if it is a python, else the command's shebang
# (#!/path/python, or #!/usr/bin/env [-S] python3).
python_of() {
  local cmd=$1 path line words w
  case "$(basename "$cmd")" in python*) echo "$cmd"; return ;; esac
  path=$(command -v "$cmd" 2>/dev/null) || { echo python3; return; }
  IFS= read -r line < "$path" || true
  [[ $line == "#!"*python* ]] || { echo python3; return; }
  read -r -a words <<< "${line#\#!}"
  for w in "${words[@]}"; do
    case "$w" in */env|env|-*) ;; *) echo "$w"; return ;; esac
  done
  echo python3
}

# ask_python ARGS: eval prelaunch.py's KEY=value lines (the recipe, the checkpoint, the machine); its
# stderr (library warnings, or its one-line error) is never evaluated.
ask_python() {
  local out err=$(mktemp)
  if ! out=$("$PYTHON" "$SCRIPT_DIR/prelaunch.py" plan "$@" 2> "$err"); then
    out=$(grep '^error: ' "$err" | tail -1 || true); out=${out#error: }
    [ -n "$out" ] || out="$PYTHON $SCRIPT_DIR/prelaunch.py failed: $(tail -1 "$err" || true)"
    rm -f "$err"
    [ "$DRY_RUN" = 1 ] && [[ $out == ROBERTA_PATH=* ]] || die "$out"
    echo "$(basename "$0"): warning: $out" >&2  # a dry run only writes the command: ask without the checkpoint
    local args=() a skip=0
    for a in "$@"; do
      if [ "$skip" = 1 ]; then skip=0; continue; fi
      case "$a" in --checkpoint|--freeze) skip=1 ;; --cuda) ;; *) args+=("$a") ;; esac
    done
    out=$("$PYTHON" "$SCRIPT_DIR/prelaunch.py" plan "${args[@]}" 2>/dev/null) || die "prelaunch.py plan failed"
  fi
  rm -f "$err"
  eval "$out"
}

# A checkpoint (and a validation) about every tenth of the run, at most every 2000 updates.
default_save_interval() {
  local n=$(( ($1 + 5) / 10 ))
  [ "$n" -ge 1 ] || n=1
  [ "$n" -le 2000 ] || n=2000
  echo "$n"
}

# FP16 auto|0|1 and HAS_CUDA -> FP16 0|1; fp16 is never asked of a machine without CUDA.
choose_fp16() {
  case "$FP16" in
    0) ;;
    auto)
      if [ "${HAS_CUDA:-1}" = 1 ]; then FP16=1; else
        FP16=0; note "no CUDA device here: training in fp32 (FP16=0)"
      fi ;;
    1) [ "$DRY_RUN" = 1 ] || [ "${HAS_CUDA:-1}" = 1 ] ||
         die "FP16=1 needs a CUDA device and torch sees none here: use FP16=0 (fp32)" ;;
  esac
}

# schedule_warnings END: a line each for a run that cannot learn: a warmup (WARMUP) not shorter than the run's
# END, RecAdam's T0 at or past it (λ(t) stays below 1/2: the encoder barely moves).
schedule_warnings() {
  local end=$1
  [ "$WARMUP" -lt "$end" ] ||
    note "warning: the warmup ($WARMUP updates) is not shorter than the run ($end updates): the lr never reaches LR=$LR"
  if [ "${METHOD_RECADAM:-0}" = 1 ] && awk -v t0="$T0" -v n="$end" 'BEGIN { exit !(t0 + 0 >= n + 0) }'; then
    note "warning: T0=$T0 is not before the run's end ($end updates): λ(t) stays below 1/2, so RecAdam barely moves the encoder; give T0 < $end"
  fi
}

# arch_flags DEFAULT: ARCH_FLAGS and MAX_POSITIONS: ARCH if given, else the checkpoint's arch and sizes
# (CKPT_*), else (a dry run without a checkpoint) --arch DEFAULT.
arch_flags() {
  if [ -n "${ARCH:-}" ]; then
    ARCH_FLAGS=(--arch "$ARCH")
  elif [ -n "${CKPT_ARCH:-}" ]; then
    read -r -a ARCH_FLAGS <<< "--arch $CKPT_ARCH $CKPT_ARCH_FLAGS"
  else  # no readable checkpoint: the missing ROBERTA_PATH is reported (a dry run writes DEFAULT)
    ARCH_FLAGS=(--arch "$1")
  fi
  MAX_POSITIONS=${MAX_POSITIONS:-${CKPT_MAX_POSITIONS:-512}}
  [[ $MAX_POSITIONS =~ ^[1-9][0-9]*$ ]] || die "MAX_POSITIONS must be a positive integer, got '$MAX_POSITIONS'"
}

# The forgetting meter (docs/forgetting-meter.md): FORGETTING_PROBE=DIR (written by scripts/binarize_probe.py)
# and FORGETTING_METER [mlm] | pairs become --forgetting-probe / --forgetting-meter on CMD; FORGETTING_BUDGET=X
# --forgetting-budget X, and BEST_METRIC (the --best-checkpoint-metric to give) fgt_budget_METRIC: checkpoint_best.pt
# is then the best validation among those that forgot at most X. forgetting_flags METRIC (the task's metric).
forgetting_flags() {
  BEST_METRIC=$1
  if [ -z "${FORGETTING_PROBE:-}" ]; then
    [ -z "${FORGETTING_METER:-}" ] || die "FORGETTING_METER=$FORGETTING_METER needs FORGETTING_PROBE=DIR (scripts/binarize_probe.py)"
    [ -z "${FORGETTING_BUDGET:-}" ] || die "FORGETTING_BUDGET=$FORGETTING_BUDGET needs FORGETTING_PROBE=DIR (scripts/binarize_probe.py)"
    return 0
  fi
  case "${FORGETTING_METER:=mlm}" in mlm|pairs) ;; *) die "FORGETTING_METER must be mlm or pairs, got '$FORGETTING_METER'" ;; esac
  [ "$DRY_RUN" = 1 ] || [ -d "$FORGETTING_PROBE" ] ||
    die "FORGETTING_PROBE=$FORGETTING_PROBE: no such directory (write it with scripts/binarize_probe.py)"
  CMD+=(--forgetting-probe "$FORGETTING_PROBE" --forgetting-meter "$FORGETTING_METER")
  if [ -n "${FORGETTING_BUDGET:-}" ]; then
    [[ $FORGETTING_BUDGET =~ ^-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]] ||
      die "FORGETTING_BUDGET must be a number (the most a validation may forget), got '$FORGETTING_BUDGET'"
    CMD+=(--forgetting-budget "$FORGETTING_BUDGET")
    BEST_METRIC=fgt_budget_$1
  fi
}

has_checkpoints() { compgen -G "$1/checkpoint*.pt" > /dev/null; }

# write_command RUN TITLE SETTINGS N_TRAIN_WORDS CMD...: RUN/command.sh, after deciding what RUN holds:
# RESTART=1 clears it; a finished run stops here (exit 0); another command for a started run is an error
# (the comparison includes command.sh's `cd` line: relative paths mean another thing from elsewhere).
# CHECK_RUN=1: that error or exit 0, nothing written or cleared (grid.sh asks it of every run before training).
write_command() {
  local run=$1 title=$2 settings=$3 n=$4
  shift 4
  local cmd=("$@") body check=${CHECK_RUN:-0}
  body=$(render_command "$n" "${cmd[@]}")
  if [ "${RESTART:-0}" = 1 ] && [ -d "$run" ]; then
    if [ "$DRY_RUN" != 1 ] && [ "$check" != 1 ]; then
      note "RESTART=1: starting $run over"
      rm -f "$run"/checkpoint*.pt "$run"/checkpoint*.pt.tmp "$run"/checkpoint_last.pt.bad-* "$run/done" "$run/train.log"
    fi
  elif [ -f "$run/command.sh" ] && { has_checkpoints "$run" || [ -f "$run/done" ]; } &&
       [ "$(grep -v '^#' "$run/command.sh" | flag_lines)" != "$(echo "$body" | flag_lines)" ]; then
    die "$run was started with another command ($(command_change "$(grep -v '^#' "$run/command.sh")" "$body")): RESTART=1 starts it over with this one, or choose another SAVE_DIR"
  elif [ -f "$run/done" ] && [ "$DRY_RUN" != 1 ] && [ "$check" != 1 ]; then
    echo "== already done: $run ($(run_score "$run"); RESTART=1 trains it again)"
    exit 0
  fi
  # said, so that a CHECK_RUN=1 left in a user's environment is not a silent exit 0 (multitask.sh, seq2seq too)
  [ "$check" != 1 ] || { echo "== CHECK_RUN=1: $run: no run of another command in the way; nothing trained"; exit 0; }
  mkdir -p "$run"
  { echo "#!/usr/bin/env bash"
    echo "# $title, written by scripts/$(basename "$(dirname "$0")")/$(basename "$0") on $(date '+%Y-%m-%d %H:%M:%S')"
    echo "# settings: $settings"
    echo "$body"
  } > "$run/command.sh"
  chmod +x "$run/command.sh"
}

# A rendered command as its lines (one flag and its values a line), sorted: the same flags in another order
# are the same command (argparse reads them so).
flag_lines() { sed 's/ *\\$//; s/^ *//' | LC_ALL=C sort; }

# command_change OLD NEW: what differs between two rendered commands, in a few words ("was --lr 2e-5; now --lr 3e-5")
command_change() {
  local a b old new
  a=$(echo "$1" | flag_lines) b=$(echo "$2" | flag_lines)
  old=$(diff <(echo "$a") <(echo "$b") | sed -n 's/^< //p' | head -3 | paste -sd ' ' - || true)
  new=$(diff <(echo "$a") <(echo "$b") | sed -n 's/^> //p' | head -3 | paste -sd ' ' - || true)
  echo "was: ${old:-nothing}; now: ${new:-nothing}"
}

# shell-quote readably: bare when safe, else in single quotes
q() { if [[ $1 =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi; }

# cd line, then the command: its first N words on one line, then one flag and its values per line
render_command() {
  local n=$1 line i
  shift
  local cmd=("$@")
  printf 'cd '; q "$PWD"; echo
  line=""
  for a in "${cmd[@]:0:n}"; do line+="$(q "$a") "; done
  printf '%s' "${line% }"
  i=$n
  while [ "$i" -lt "${#cmd[@]}" ]; do
    line=$(q "${cmd[i]}")
    i=$((i + 1))
    while [ "$i" -lt "${#cmd[@]}" ] && [[ ${cmd[i]} != --* ]]; do line+=" $(q "${cmd[i]}")"; i=$((i + 1)); done
    printf ' \\\n  %s' "$line"
  done
  echo
}

# Run CMD in RUN (continuing from its newest complete checkpoint). fairseq-train appends to train.log itself:
# a pipe the user closes (`| head`) loses nothing of the log and does not stop the run. The terminal gets one
# line per log interval and validation (prelaunch.py follow; fairseq's config and Hydra's warnings stay in
# the log), an error as the last line. `done` is written once the run ended well, then the end line with
# the best dev score (summarize.py --run; SUMMARY_METRIC: that metric, with the other subsets' at its update).
train_and_mark_done() {
  local run=$1 msg rc log=$1/train.log follower err
  if has_checkpoints "$run"; then  # its one line on stdout; library warnings (stderr) are not it
    err=$(mktemp)
    msg=$("$PYTHON" "$SCRIPT_DIR/prelaunch.py" resume "$run" 2> "$err") ||
      { msg=$(tail -1 "$err"); rm -f "$err"; die "${msg##*error: }"; }
    rm -f "$err"
    note "$msg"
    echo "$(basename "$0"): $msg" >> "$log"
  fi
  touch "$log"
  "$PYTHON" "$SCRIPT_DIR/prelaunch.py" follow "$log" --offset "$(wc -c < "$log")" --pid $$ ${METRIC:+--metric "$METRIC"} &
  follower=$!
  set +e
  "${CMD[@]}" >> "$log" 2>&1
  rc=$?
  set -e
  kill -TERM "$follower" 2>/dev/null || true
  wait "$follower" 2>/dev/null || true
  if [ "$rc" -ne 0 ]; then
    err=$(grep -E '^(fairseq-train: error: |[A-Za-z_.]*(Error|Exception): )' "$log" | tail -1 || true)
    echo "$(basename "$0"): error: fairseq-train failed (exit $rc)${err:+: $err}; see $log" >&2
    exit "$rc"
  fi
  date '+%Y-%m-%d %H:%M:%S' > "$run/done"
  echo "== done: $run ($(run_score "$run"))"
}

# run_score RUN: the run's best dev score, where, and the file holding it (summarize.py --run; SUMMARY_METRIC:
# that metric, with the other subsets' at its update), for the end line and a finished run's `== already done`.
run_score() {
  "$PYTHON" "$SCRIPT_DIR/summarize.py" --run "$1" ${SUMMARY_METRIC:+--metric "$SUMMARY_METRIC"} 2>/dev/null ||
    echo "no dev score in its log"
}
