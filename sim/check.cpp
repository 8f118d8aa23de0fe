#include "sim/check.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace trainplan {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  throw std::logic_error(fmt::format("internal error at {}:{}: {} ({})", file, line, msg, expr));
}

namespace {

// Length of the valid UTF-8 sequence at text[i] (1 to 4), or 0 when the byte there does not start
// one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, or cut short).
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char b = byte(i);
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;  // overlong
    if (b == 0xED) hi = 0x9F;  // UTF-16 surrogates
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;  // overlong
    if (b == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + n > text.size() || byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  return n;
}

// The text as shown, one piece per character: the character itself, or its escape.
std::vector<std::string> shown_pieces(std::string_view text) {
  std::vector<std::string> pieces;
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    const std::size_t n = utf8_length(text, i);
    if (n == 0 || (n == 1 && (b < 0x20 || b == 0x7f))) {
      pieces.push_back(fmt::format("\\x{:02x}", b));  // C0, DEL or a byte of no valid character
      ++i;
      continue;
    }
    // C1 controls U+0080-U+009F are the two bytes C2 80 .. C2 9F.
    if (n == 2 && b == 0xC2 && static_cast<unsigned char>(text[i + 1]) <= 0x9F) {
      pieces.push_back(fmt::format("\\u{{{:x}}}", static_cast<unsigned char>(text[i + 1])));
    } else {
      pieces.emplace_back(text.substr(i, n));
    }
    i += n;
  }
  return pieces;
}

std::size_t width(const std::string& piece) { return piece.size() > 1 && piece[0] == '\\' ? piece.size() : 1; }

// pieces[from, to) appended to `out`, or, when wider than `limit`, its first and last pieces
// around `gap` (about two thirds of the room before it), never splitting an escape or a character.
void append_cut(std::vector<std::string>& out, const std::vector<std::string>& pieces, std::size_t from,
                std::size_t to, std::size_t limit, std::string_view gap) {
  std::size_t total = 0;
  for (std::size_t k = from; k < to; ++k) total += width(pieces[k]);
  if (total <= limit) {
    out.insert(out.end(), pieces.begin() + static_cast<std::ptrdiff_t>(from), pieces.begin() + static_cast<std::ptrdiff_t>(to));
    return;
  }
  const std::size_t room = limit - gap.size(), head_room = room - room / 3;
  std::size_t head = from, used = 0;
  while (head < to && used + width(pieces[head]) <= head_room) used += width(pieces[head++]);
  std::size_t tail = to;
  while (tail > head && used + width(pieces[tail - 1]) <= room) used += width(pieces[--tail]);
  out.insert(out.end(), pieces.begin() + static_cast<std::ptrdiff_t>(from), pieces.begin() + static_cast<std::ptrdiff_t>(head));
  for (char c : gap) out.emplace_back(1, c);
  out.insert(out.end(), pieces.begin() + static_cast<std::ptrdiff_t>(tail), pieces.begin() + static_cast<std::ptrdiff_t>(to));
}

}  // namespace

std::string printable(std::string_view text, std::size_t max_line) {
  const std::vector<std::string> pieces = shown_pieces(text);
  std::vector<std::string> runs_cut;  // each run without a space cut to kMaxShownValue
  for (std::size_t i = 0; i < pieces.size();) {
    std::size_t j = i;
    while (j < pieces.size() && pieces[j] != " ") ++j;
    append_cut(runs_cut, pieces, i, j, kMaxShownValue, "...");
    if (j < pieces.size()) runs_cut.push_back(" ");
    i = j + 1;
  }
  std::vector<std::string> line;
  append_cut(line, runs_cut, 0, runs_cut.size(), std::max<std::size_t>(max_line, 16), " ... ");
  std::string out;
  for (const std::string& p : line) out += p;
  return out;
}

bool has_control_characters(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    const std::size_t n = utf8_length(text, i);
    if (n == 0 || (n == 1 && (b < 0x20 || b == 0x7f))) return true;
    if (n == 2 && b == 0xC2 && static_cast<unsigned char>(text[i + 1]) <= 0x9F) return true;
    i += n;
  }
  return false;
}

}  // namespace trainplan
