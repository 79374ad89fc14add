#!/usr/bin/env bash
# Keeps the Dockerfile honest without Docker: runs each of its `RUN scripts/build.sh …` lines
# (dev profile, the prefix /opt/sluice mapped to target/dist-check/<stage>), checks that every
# `COPY --from=<stage> SRC` names something that build installed, that the libraries the
# runtime stages' binary loads come from their apt packages, and runs what the runtime
# stages would run: the fleet binary (no libtorch) through the quickstart pipeline, the train
# binary against the libtorch in its own prefix through one epoch of the quickstart training.
# scripts/test.sh runs it (needs LIBTORCH's script and OpenMPI, as the suite does).
set -euo pipefail
cd "$(dirname "$0")/.."
out="target/dist-check"
fail() { echo "check-dockerfile: $*" >&2; exit 1; }

# Stage name of each line (continuation lines joined), the build lines, the COPY lines and
# each stage's apt packages.
stage=""
declare -A prefix_of=() packages_of=()
builds=() copies=()
while IFS= read -r line; do
    if [[ "$line" =~ ^FROM[[:space:]].*[[:space:]]AS[[:space:]]+([A-Za-z0-9_-]+) ]]; then
        stage="${BASH_REMATCH[1]}"
    elif [[ "$line" =~ ^RUN[[:space:]]+scripts/build\.sh[[:space:]]+(.*)$ ]]; then
        builds+=("$stage|${BASH_REMATCH[1]}")
    elif [[ "$line" =~ ^COPY[[:space:]]+--from=([A-Za-z0-9_-]+)[[:space:]]+([^[:space:]]+)[[:space:]] ]]; then
        copies+=("${BASH_REMATCH[1]}|${BASH_REMATCH[2]}|$stage")
    elif [[ "$line" =~ apt-get[[:space:]]+install[[:space:]]+([^\&]*) ]]; then
        for word in ${BASH_REMATCH[1]}; do
            [[ "$word" == -* ]] || packages_of[$stage]+=" $word"
        done
    fi
done < <(sed -e ':a' -e '/\\$/N; s/\\\n/ /; ta' Dockerfile)
((${#builds[@]} >= 2)) || fail "expected a build stage with libtorch and one without, found ${#builds[@]} build line(s)"
((${#copies[@]} >= 1)) || fail "no COPY --from lines"

for b in "${builds[@]}"; do
    name="${b%%|*}" args=()
    read -r -a words <<<"${b#*|}"
    # The image's prefix becomes a folder of target/; everything else is passed as written.
    for ((i = 0; i < ${#words[@]}; i++)); do
        if [[ "${words[i]}" == --prefix ]]; then
            [[ "${words[i + 1]:-}" == /opt/sluice ]] || fail "$name: --prefix is ${words[i + 1]:-missing}, the COPY lines expect /opt/sluice"
            i=$((i + 1))
        else
            args+=("${words[i]}")
        fi
    done
    prefix_of[$name]="$out/$name"
    echo "[check-dockerfile] $name: scripts/build.sh ${args[*]} --profile dev --prefix $out/$name" >&2
    rm -rf "${out:?}/$name"
    scripts/build.sh "${args[@]}" --profile dev --prefix "$out/$name"
done

for c in "${copies[@]}"; do
    IFS='|' read -r from src _ <<<"$c"
    [[ -n "${prefix_of[$from]:-}" ]] || fail "COPY --from=$from: no build stage of that name runs scripts/build.sh"
    [[ "$src" == /opt/sluice/* ]] || fail "COPY --from=$from $src: not under the build's prefix /opt/sluice"
    [[ -e "${prefix_of[$from]}/${src#/opt/sluice/}" ]] || fail "COPY --from=$from $src: the build did not install it"
done

# Every shared library a runtime stage's `sluice` loads from outside its own folder comes from
# a package that stage installs (or one those depend on, or one every Debian image has): the
# host has more installed than debian:bookworm-slim, so running the binary here proves less.
if command -v dpkg >/dev/null && command -v apt-cache >/dev/null; then
    base="$(dpkg-query -W -f='${Package} ${Priority}\n' | awk '$2 == "required" {print $1}')"
    for c in "${copies[@]}"; do
        IFS='|' read -r from src into <<<"$c"
        [[ "$src" == */bin/sluice ]] || continue
        p="$(realpath "${prefix_of[$from]}")"
        # shellcheck disable=SC2086
        closure="$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
            --no-breaks --no-replaces --no-enhances ${packages_of[$into]:-} 2>/dev/null | grep -v '^ ' || true)"
        if [[ -z "$closure" ]]; then
            echo "[check-dockerfile] $into: no apt package lists here (apt-get update): its packages are not checked" >&2
            continue
        fi
        allowed="$base $closure"
        while read -r soname _ path _; do
            [[ "$path" == not ]] && fail "$into: sluice needs $soname, found nowhere"
            [[ -z "$path" || "$path" == "$p"/* ]] && continue
            pkg="$(dpkg -S "$path" 2>/dev/null || dpkg -S "/usr$path" 2>/dev/null || dpkg -S "$(realpath "$path")" 2>/dev/null || true)"
            pkg="${pkg%%:*}"
            [[ -n "$pkg" ]] || fail "$into: sluice needs $path, which no Debian package provides"
            grep -qx -- "$pkg" <<<"$(tr ' ' '\n' <<<"$allowed")" \
                || fail "$into: sluice needs $path from the package $pkg, which the stage's apt-get install does not bring"
        done < <(LD_LIBRARY_PATH="$p/lib" ldd "$p/bin/sluice" | awk '/=>/ {print $1, $2, $3, $4}')
        echo "[check-dockerfile] $into: every library sluice loads comes from the prefix or the stage's packages" >&2
    done
else
    echo "[check-dockerfile] no dpkg/apt-cache here: the runtime stages' packages are not checked" >&2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for name in "${!prefix_of[@]}"; do
    p="${prefix_of[$name]}"
    if [[ -d "$p/lib" ]]; then
        # The train image: libtorch from the image's own folder (LD_LIBRARY_PATH, as its ENV).
        resolved="$(LD_LIBRARY_PATH="$p/lib" ldd "$p/bin/sluice" | awk '/libtorch_cpu/ {print $3}')"
        [[ "$resolved" == "$p/lib/libtorch_cpu.so" ]] || fail "$name: libtorch_cpu resolves to '$resolved', not the prefix's"
        LD_LIBRARY_PATH="$p/lib" OMP_NUM_THREADS=1 SLUICE_OUT_DIR="$work/$name" "$p/bin/sluice" -q train \
            configs/quickstart.yaml --set trainer.epochs=1 --no-report >"$work/$name.log" 2>&1 \
            || { cat "$work/$name.log" >&2; fail "$name: one epoch of the quickstart training failed"; }
    else
        # The fleet image: no libtorch, the quickstart pipeline runs, training is refused.
        if ldd "$p/bin/sluice" | grep -q libtorch; then fail "$name: links libtorch"; fi
        SLUICE_OUT_DIR="$work/$name" "$p/bin/sluice" run configs/quickstart.yaml \
            --summary-json "$work/$name.json" --no-report >"$work/$name.log" 2>&1 \
            || { cat "$work/$name.log" >&2; fail "$name: the quickstart pipeline failed"; }
        grep -q '"rows_written": *1437' "$work/$name.json" || fail "$name: did not write 1437 rows"
        if "$p/bin/sluice" train configs/quickstart.yaml >"$work/$name.train" 2>&1; then
            fail "$name: train ran without libtorch"
        fi
        grep -q torch "$work/$name.train" || fail "$name: train's refusal does not name the torch feature"
    fi
    echo "[check-dockerfile] $name: ok" >&2
done
