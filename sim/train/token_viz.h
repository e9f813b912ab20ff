// sim/train/token_viz.h: the token-probability page of `tpusim train` (token_viz_file).
//
// At every evaluation the trainer records the log-probability the model gives each target token
// of a fixed sample of held-out sequences (the first sequences of evaluation batch 0) and
// rewrites one self-contained HTML page (html_page.h's frame: inline CSS and script, no network):
// a heatmap per sequence, each token coloured by its probability (log scale, 0.001 to 1) with the
// values on hover, a step selector over the evaluations, and the training and evaluation loss
// curves.
//
// Example:
//   TokenViz viz{.title = "tiny-llama on GPL-3", .pieces = {{"T", "h", "e"}}};
//   viz.steps.push_back({.step = 100, .log_probs = {{-0.1, -2.3, -0.7}}});
//   viz.loss = {{1, 5.5}, {100, 2.1}};
//   write_file_atomically("tokens.html", render_token_viz(viz));
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tpusim {

struct TokenViz {
  std::string title;
  std::string tokenizer_path;  // "" = bytes; how the trainer turns tokens into text
  // Per sampled sequence, the text of each target token (the token whose probability is shown).
  std::vector<std::vector<std::string>> pieces;
  struct Step {
    int64_t step = 0;
    std::vector<std::vector<float>> log_probs;  // [sequence][position], natural log
  };
  std::vector<Step> steps;
  std::vector<std::pair<int64_t, double>> loss;       // (step, training loss)
  std::vector<std::pair<int64_t, double>> eval_loss;  // (step, evaluation loss)
};

std::string render_token_viz(const TokenViz& viz);

// How a byte-level token shows on the page: printable ASCII as itself, a newline as "⏎", a tab as
// "⇥", other bytes as "\xNN".
std::string byte_token_text(int32_t token);

}  // namespace tpusim
