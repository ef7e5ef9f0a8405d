# shellcheck shell=bash
# Shared by launch/tpu.sh and launch/slurm.sh (sourced, not run).

prog=${prog:-$(basename "$0")}  # the calling script's name, for messages

# Empty arrays under set -u need bash >= 4.4 (macOS ships 3.2: brew install bash).
if (( BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4) )); then
  echo "$0: needs bash >= 4.4 (this is ${BASH_VERSION})" >&2
  exit 2
fi

die() {
  echo "${prog}: error: $*" >&2
  echo "Run '${prog} --help' for the options." >&2
  exit 2
}

# Prints the words as one shell command line: bare when safe, otherwise in single quotes. Readable (unlike
# printf %q) and valid for any POSIX shell, which matters for commands that run on other machines.
quote() {
  local word prefix out=()
  for word in "$@"; do
    prefix=""
    # --flag='value' rather than '--flag=value': the flag stays visible.
    if [[ "${word}" =~ ^--[A-Za-z0-9_.-]+= ]]; then
      prefix=${BASH_REMATCH[0]}
      word=${word#"${prefix}"}
    fi
    if [[ "${word}" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      out+=("${prefix}${word}")
    else
      out+=("${prefix}'${word//\'/\'\\\'\'}'")
    fi
  done
  echo "${out[*]}"
}

# Checks that option $1 got a value ($2); a following option means the value was forgotten.
need_value() {
  if [[ $# -lt 2 || -z "$2" || "$2" == --* ]]; then
    die "$1 needs a value"
  fi
}

