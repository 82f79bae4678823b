#!/usr/bin/env bash
# Status::ok() is a static factory (an OK status). Called on an instance,
# `if (!st.ok())` compiles and is always false, so the error is silently
# ignored: test instances with `if (!st)` or `st.is_ok()`. This check finds
# `<expr>.ok()` in our sources (sentencepiece's util::Status, which has a real
# ok(), is the one exception).
SRC=${1:?usage: status_ok_test.sh SOURCE_DIR}
hits=$(grep -rnE '[]A-Za-z0-9_)]\.ok\(\)' "$SRC/src" "$SRC/tools" "$SRC/tests" "$SRC/bench" \
         --include='*.cc' --include='*.h' --include='*.cu' \
       | grep -v 'src/data/sentencepiece_tokenizer.cc' | grep -v 'Status::ok()')
if [ -n "$hits" ]; then
  echo "FAIL: .ok() called on an instance (always OK; use !st or st.is_ok()):"
  echo "$hits"
  exit 1
fi
echo "no .ok() on Status instances"
