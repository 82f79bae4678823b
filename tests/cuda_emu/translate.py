#!/usr/bin/python3
"""Rewrites a CUDA source (.cu or .cuh) as C++ for the host emulator (emu.h).

Usage: translate.py INPUT OUTPUT

Four rewrites, outside comments and string literals:
  kernel<<<config>>>(args)
      -> ::emu::launch("kernel", ::emu::config(config), EMU_KERNEL_ADDRESS(kernel),
                       [&](auto&... emu_args_) { kernel(emu_args_...); }, args)
     (the address is what cudaFuncSetAttribute knows the kernel by; null
     where `kernel` is a template-id that leaves arguments to deduction,
     see emu.h)
  __shared__ T name[N]...;
      -> static T name[N]...; ::emu::shared_block(&name, sizeof(name));
  extern __shared__ T name[];
      -> T* name = static_cast<T*>(::emu::dynamic_shared());
     (dynamic shared memory; T one or more words of a type name, such as
     float, uint4 or unsigned char, without qualifiers or attributes)
  __launch_bounds__(n[, m]) ... {
      -> ... { ::emu::launch_bounds(n[, m]);
The output starts with `#include "emu.h"` and a #line directive naming INPUT,
and every rewrite keeps its text on the lines it came from, so compiler
messages, __LINE__ and std::source_location point into INPUT. Anything of the
three tokens left over (a form this script does not know) is an error.
Standard library only: CMake runs it with /usr/bin/python3 at build time.
"""

import re
import sys


class TranslateError(Exception):
    pass


def code_mask(src):
    """True at each index of src that is code (not a comment, string or character literal)."""
    mask = [True] * len(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif c == "'" and i > 0 and src[i - 1].isalnum():
            i += 1  # a digit separator (1'000), not a character literal
            continue
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            j += 1
        else:
            i += 1
            continue
        for k in range(i, min(j, n)):
            mask[k] = False
        i = j
    return mask


def occurrences(src, mask, token):
    i = src.find(token)
    while i >= 0:
        if mask[i]:
            yield i
        i = src.find(token, i + 1)


def line_of(src, pos):
    return src.count("\n", 0, pos) + 1


def matching_paren(src, mask, open_pos, where):
    depth = 0
    for i in range(open_pos, len(src)):
        if not mask[i]:
            continue
        if src[i] == "(":
            depth += 1
        elif src[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise TranslateError("%s: unbalanced parentheses" % where)


def kernel_start(src, end, where):
    """Start of the kernel expression (name, ::, template arguments) that ends at src[end - 1]."""
    k = end
    depth = 0
    while k > 0:
        c = src[k - 1]
        if c == ">":
            depth += 1
        elif c == "<":
            depth -= 1
        elif depth == 0 and not (c.isalnum() or c in "_:"):
            break
        k -= 1
    if k == end or depth != 0 or "\n" in src[k:end]:
        raise TranslateError("%s: cannot read the kernel name before <<<" % where)
    return k


def launches(src, mask, name):
    for j in occurrences(src, mask, "<<<"):
        where = "%s:%d" % (name, line_of(src, j))
        end = j
        while end > 0 and src[end - 1] in " \t":
            end -= 1
        start = kernel_start(src, end, where)
        kernel = src[start:end]
        e = src.find(">>>", j + 3)
        if e < 0:
            raise TranslateError("%s: <<< without >>>" % where)
        config = src[j + 3 : e]
        p = e + 3
        while p < len(src) and src[p] in " \t\n":
            p += 1
        if p >= len(src) or src[p] != "(":
            raise TranslateError("%s: no argument list after >>>" % where)
        close = matching_paren(src, mask, p, where)
        args = src[p + 1 : close]
        text = ('::emu::launch("%s", ::emu::config(%s), EMU_KERNEL_ADDRESS(%s), '
                '[&](auto&... emu_args_) { %s(emu_args_...); }%s%s)') % (
                    kernel, config, kernel, kernel, ", " if args.strip() else "", args)
        yield start, close + 1, text


SHARED = re.compile(r"__shared__\s+(?P<decl>[^;{}()]*?(?P<name>[A-Za-z_]\w*)\s*(?:\[[^\];]*\]\s*)*);")
EXTERN = re.compile(r"\bextern\s+$")
DYNAMIC = re.compile(r"extern\s+__shared__\s+(?P<type>[A-Za-z_:][\w:]*(?:\s+[A-Za-z_:][\w:]*)*?)\s+"
                     r"(?P<name>[A-Za-z_]\w*)\s*\[\s*\]\s*;")


def shared_arrays(src, mask, name):
    for i in occurrences(src, mask, "__shared__"):
        where = "%s:%d" % (name, line_of(src, i))
        extern = EXTERN.search(src, 0, i)
        if extern and mask[extern.start()]:
            m = DYNAMIC.match(src, extern.start())
            if not m:
                raise TranslateError("%s: unsupported dynamic shared memory declaration (the form is "
                                     "`extern __shared__ T name[];`)" % where)
            # On one line, followed by the newlines the declaration spanned:
            # the lines below keep their numbers.
            t = " ".join(m.group("type").split())
            yield extern.start(), m.end(), "%s* %s = static_cast<%s*>(::emu::dynamic_shared());%s" % (
                t, m.group("name"), t, "\n" * m.group(0).count("\n"))
            continue
        m = SHARED.match(src, i)
        if not m:
            raise TranslateError("%s: unsupported __shared__ declaration" % where)
        if "[]" in re.sub(r"\s", "", m.group("decl")):
            raise TranslateError("%s: __shared__ array without a size that is not extern" % where)
        yield i, m.end(), "static %s; ::emu::shared_block(&%s, sizeof(%s));" % (
            m.group("decl"), m.group("name"), m.group("name"))


def launch_bounds(src, mask, name):
    for i in occurrences(src, mask, "__launch_bounds__"):
        where = "%s:%d" % (name, line_of(src, i))
        p = i + len("__launch_bounds__")
        while src[p] in " \t":
            p += 1
        if src[p] != "(":
            raise TranslateError("%s: __launch_bounds__ without arguments" % where)
        close = matching_paren(src, mask, p, where)
        bounds = src[p + 1 : close]
        depth = 0
        for b in range(close + 1, len(src)):
            if not mask[b]:
                continue
            if src[b] == "(":
                depth += 1
            elif src[b] == ")":
                depth -= 1
            elif depth == 0 and src[b] == ";":
                raise TranslateError("%s: __launch_bounds__ on a declaration without a body" % where)
            elif depth == 0 and src[b] == "{":
                break
        else:
            raise TranslateError("%s: no function body after __launch_bounds__" % where)
        yield i, close + 1, ""
        yield b + 1, b + 1, " ::emu::launch_bounds(%s);" % bounds


def translate(src, name):
    mask = code_mask(src)
    edits = sorted(list(launches(src, mask, name)) + list(shared_arrays(src, mask, name)) +
                   list(launch_bounds(src, mask, name)))
    out, pos = [], 0
    for start, end, text in edits:
        if start < pos:
            raise TranslateError("%s:%d: overlapping rewrites" % (name, line_of(src, start)))
        out.append(src[pos:start])
        out.append(text)
        pos = end
    out.append(src[pos:])
    body = "".join(out)
    body_mask = code_mask(body)
    for token in ("<<<", "__shared__", "__launch_bounds__"):
        for i in occurrences(body, body_mask, token):
            raise TranslateError("%s:%d: %s left untranslated" % (name, line_of(body, i), token))
    quoted = name.replace("\\", "\\\\").replace('"', '\\"')
    return '#include "emu.h"\n#line 1 "%s"\n%s' % (quoted, body)


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: translate.py INPUT OUTPUT\n")
        return 2
    with open(argv[1], encoding="utf-8") as f:
        src = f.read()
    try:
        text = translate(src, argv[1])
    except TranslateError as e:
        sys.stderr.write("translate.py: %s\n" % e)
        return 1
    with open(argv[2], "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
