// sim/explore/program_signature.h: which per-device programs are the same program, whatever the
// mesh axes are called.
//
// Two candidates run the same program when `tpusim program` prints the same ops, local shapes,
// dtypes and collectives (group sizes and bytes) for them, read without the mesh axes' names:
// on a dense model MaxText's rules split the batch and `embed` over `expert` as over `fsdp`, so a
// mesh of fsdp=8 expert=2 can give the program of fsdp=16 under another name. The signature
// hashes that text (Graph::to_text with the "@axis" and "over {axes}" parts left out) with the
// microbatch and the global batch (the header of `tpusim program`). Perf switches, the attention
// kernel's block sizes and the placement do not enter the program, so they never change it.
// explore lists one candidate per signature (the best), with the other spellings it timed.
//
// The hash is cut to 52 bits so that it passes through a double exactly (merge_ranks exchanges
// doubles). Two different programs sharing a signature is possible in principle (1 in 2^52 per
// pair) and would only hide the slower of them from the top N.
//
// Example:
//   program_signature(step_program) == program_signature(other)  // same `tpusim program` text
//   program_text_without_axes("x[embed:256@fsdp] over {fsdp} group 16")  // "x[embed:256] group 16"
#pragma once

#include <cstdint>
#include <string>

#include "sharding/step_program.h"

namespace tpusim {

// Never 0 (0 means "no signature" in Scored).
uint64_t program_signature(const StepProgram& program);

// `text` without the mesh axes' names: "@a+b" after a dim's size and " over {a,b}".
std::string program_text_without_axes(const std::string& text);

}  // namespace tpusim
