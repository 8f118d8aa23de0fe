// Errors. InputError: the user's input is wrong (the CLI turns it into exit code 2 and one line).
// TRAINPLAN_CHECK: an internal invariant; stays on in release builds and throws std::logic_error.
// printable(): the one rule for text from a user or a file shown on a terminal.
#pragma once
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace trainplan {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void check_failed(const char* expr, const char* file, int line, const std::string& msg);

// A value longer than this many characters is cut when shown (a run of characters without a
// space: a flag value, a path, a name); a line longer than kMaxShownLine is cut as well.
inline constexpr std::size_t kMaxShownValue = 80;
inline constexpr std::size_t kMaxShownLine = 1000;

// `text` as one printable line, the rule for every error line and for every string read from a
// file or the command line that a console printer shows:
//  - a control character (Unicode category Cc: C0 U+0000-U+001F, DEL, C1 U+0080-U+009F, e.g. the
//    CSI introducer U+009B) is shown as \xNN (C0, DEL) or \u{NN} (C1), so a newline or terminal
//    escape in a value can neither split the line nor drive the terminal;
//  - a byte that is not part of valid UTF-8 is shown as \xNN;
//  - a run of more than kMaxShownValue characters without a space keeps its first and last
//    characters around "..." (kMaxShownValue in all), so the start of a value and the end of a
//    path both stay readable;
//  - a result longer than `max_line` characters keeps its start and end around " ... ".
// Characters are counted as shown (an escape counts its length, a UTF-8 character one).
std::string printable(std::string_view text, std::size_t max_line = kMaxShownLine);

// True when `text` holds a character printable() would escape (a control character or invalid
// UTF-8): free text given as a flag or read from a file is refused with it.
bool has_control_characters(std::string_view text);

}  // namespace trainplan

#define TRAINPLAN_CHECK(cond, msg)                                           \
  do {                                                                       \
    if (!(cond)) ::trainplan::check_failed(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
