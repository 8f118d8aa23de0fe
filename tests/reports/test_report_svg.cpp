// reports/svg: chart geometry against values worked out by hand (see the comment of each test for
// the arithmetic), tick choice, escaping and point thinning.
#include "reports/svg.hpp"

#include <gtest/gtest.h>

#include <random>

namespace {

using namespace trainplan::svg;

TEST(Svg, EscapesMarkupAndControlCharacters) {
  EXPECT_EQ(escape("a<b & \"c\" 'd' >"), "a&lt;b &amp; &quot;c&quot; &#39;d&#39; &gt;");
  EXPECT_EQ(escape(std::string("x\x01y")), "x\xEF\xBF\xBDy");
  EXPECT_EQ(escape("tab\tnewline\n"), "tab\tnewline\n");
}

TEST(Svg, NumbersHaveAtMostTwoDecimals) {
  EXPECT_EQ(num(12.5), "12.5");
  EXPECT_EQ(num(3.0), "3");
  EXPECT_EQ(num(-0.001), "0");
  EXPECT_EQ(num(1.0 / 3), "0.33");
}

TEST(Svg, NiceTicksUseStepsOf1_2_5) {
  // 0..87 in at most 5 intervals: raw step 17.4 -> 20; 0, 20, ..., 100.
  EXPECT_EQ(nice_ticks(0, 87, 5), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  // 0.3..1.7: raw 0.28 -> 0.5; from floor(0.6) = 0 to ceil(3.4) = 4 steps.
  EXPECT_EQ(nice_ticks(0.3, 1.7, 5), (std::vector<double>{0, 0.5, 1, 1.5, 2}));
  // A single value is widened to [0, 2v].
  EXPECT_EQ(nice_ticks(4, 4, 4), (std::vector<double>{0, 2, 4, 6, 8}));
  EXPECT_EQ(tick_label(0.5, 0.5), "0.5");
  EXPECT_EQ(tick_label(100, 20), "100");
  EXPECT_EQ(tick_label(0.25, 0.05), "0.25");
}

TEST(Svg, LogTicksCoverTheRangeWith1_2_5) {
  // 2.1..50: the largest of 1,2,5 x 10^k <= 2.1 is 2; then up to the first >= 50.
  EXPECT_EQ(log_ticks(2.1, 50, 8), (std::vector<double>{2, 5, 10, 20, 50}));
  // 1..1e6 would need 19 ticks of 1,2,5: powers of ten only.
  EXPECT_EQ(log_ticks(1, 1e6, 8), (std::vector<double>{1, 10, 100, 1000, 1e4, 1e5, 1e6}));
  const Scale s{1, 100, 0, 200, true};
  EXPECT_DOUBLE_EQ(s(10), 100);  // a decade is half of two decades
}

TEST(Svg, StackedBarHeightsAreProportionalToTheValues) {
  StackedBars c;
  c.categories = {"stage 0", "stage 1"};
  c.series = {{"weights", "#111"}, {"activations", "#222"}};
  c.values = {{10, 20}, {5, 0}};
  c.y.label = "GB";
  c.reference = 80;
  const Svg svg = stacked_bars(c, 760, 340);
  // Frame: left 72, top 16, width 760-72-24 = 664, height 340-16-52 = 272. y domain: ticks of
  // [0, max(30, 80)] = 0, 20, ..., 80. So 1 GB = 272/80 = 3.4 units; bottom at y = 288.
  const auto bars = svg.find("bar s0");
  const auto tops = svg.find("bar s1");
  ASSERT_EQ(bars.size(), 2u);
  ASSERT_EQ(tops.size(), 1u);  // a zero value draws no bar
  EXPECT_DOUBLE_EQ(bars[0].number("height"), 34);   // 10 x 3.4
  EXPECT_DOUBLE_EQ(bars[0].number("y"), 254);       // 288 - 34
  EXPECT_DOUBLE_EQ(tops[0].number("height"), 68);   // 20 x 3.4, stacked on the first
  EXPECT_DOUBLE_EQ(tops[0].number("y"), 186);       // 288 - 34 - 68
  EXPECT_DOUBLE_EQ(bars[1].number("height"), 17);   // 5 x 3.4
  // Slot 664/2 = 332; the bar is its middle 60%: x = 72 + 0.2 x 332, width 0.6 x 332.
  EXPECT_DOUBLE_EQ(bars[0].number("x"), 138.4);
  EXPECT_DOUBLE_EQ(bars[0].number("width"), 199.2);
  EXPECT_DOUBLE_EQ(bars[1].number("x"), 470.4);     // 72 + 332 + 66.4
  const auto ref = svg.find("reference");
  ASSERT_EQ(ref.size(), 1u);
  EXPECT_DOUBLE_EQ(ref[0].number("y1"), 16);        // 80 GB: the top of the frame
  const auto ticks = svg.find("tick");
  ASSERT_GE(ticks.size(), 5u);
  EXPECT_EQ(ticks[0].text, "0");
  EXPECT_EQ(ticks[4].text, "80");
  EXPECT_DOUBLE_EQ(ticks[4].number("y"), 20);       // tick at y = 16, text baseline 4 below
}

TEST(Svg, GroupedBarsScaleFromZeroAndShowMissingValues) {
  GroupedBars c;
  c.rows = {"step", "other"};
  c.series = {{"predicted", "#111"}};
  c.values = {{4.0}, {std::nullopt}};
  c.value_text = {{"4.000 s"}, {""}};
  const Svg svg = grouped_bars(c, 760);
  // Margins 190 / 130: frame width 440; ticks of [0, 4]: step 1, domain [0, 4].
  EXPECT_DOUBLE_EQ(svg.height(), 8 + 46 + 2 * kBarRowHeight);
  const auto bars = svg.find("bar s0");
  ASSERT_EQ(bars.size(), 1u);
  EXPECT_DOUBLE_EQ(bars[0].number("x"), 190);
  EXPECT_DOUBLE_EQ(bars[0].number("width"), 440);
  bool na = false;
  for (const auto& e : svg.find("value")) na |= e.text == "n/a";
  EXPECT_TRUE(na);
}

TEST(Svg, ScatterMapsPointsOntoTheFrame) {
  Scatter c;
  c.series = {{"front", "#111", {{1, 10, "1", ""}, {3, 30, "", ""}}, true, 3, true}};
  const Svg svg = scatter(c, 760, 420);
  // Frame: left 76, top 16, width 660, height 352. x ticks of [1, 3]: step 0.5, domain [1, 3];
  // y ticks of [10, 30]: step 5, domain [10, 30].
  const auto pts = svg.find("point s0");
  ASSERT_EQ(pts.size(), 2u);
  EXPECT_DOUBLE_EQ(pts[0].number("cx"), 76);
  EXPECT_DOUBLE_EQ(pts[0].number("cy"), 368);
  EXPECT_DOUBLE_EQ(pts[1].number("cx"), 736);
  EXPECT_DOUBLE_EQ(pts[1].number("cy"), 16);
  const auto line = svg.find("line s0");
  ASSERT_EQ(line.size(), 1u);
  EXPECT_EQ(line[0].attr("points"), "76,368 736,16");
  ASSERT_EQ(svg.find("point-label").size(), 1u);
}

TEST(Svg, CompactLabelsAreForPeople) {
  EXPECT_EQ(compact_label(50000000), "50M");
  EXPECT_EQ(compact_label(1.5e13), "15T");
  EXPECT_EQ(compact_label(2500), "2.5K");
  EXPECT_EQ(compact_label(12345678), "12.3M");
  EXPECT_EQ(compact_label(999), "999");
  EXPECT_EQ(compact_label(1e9), "1B");
  EXPECT_EQ(compact_label(0.25), "0.25");
  EXPECT_EQ(compact_label(0), "0");
  EXPECT_EQ(compact_label(2e15), "2000T");  // never an exponent
  EXPECT_EQ(compact_label(-3e6), "-3M");
}

// A cost axis in dollars: "$5M" ticks, not "5000000", and its name clear of them.
TEST(Svg, CompactAxisTicksAndANameThatClearsThem) {
  Scatter c;
  c.series = {{"a", "#111", {{10, 5e6, "", ""}, {100, 2e7, "", ""}}, false, 3, true}};
  c.x = {"days", true, std::nullopt, std::nullopt, true};
  c.y = {"cost (USD)", true, std::nullopt, std::nullopt, true, "$"};
  const Svg svg = scatter(c, 760, 420);
  std::vector<std::string> labels;
  double widest = 0;
  for (const Element& t : svg.find("tick")) {
    labels.push_back(t.text);
    EXPECT_EQ(t.text.find("e+"), std::string::npos) << t.text;
    if (t.attr("text-anchor") == "end") widest = std::max(widest, 7.0 * static_cast<double>(t.text.size()));
  }
  EXPECT_NE(std::find(labels.begin(), labels.end(), "$5M"), labels.end());
  EXPECT_NE(std::find(labels.begin(), labels.end(), "$20M"), labels.end());
  EXPECT_NE(std::find(labels.begin(), labels.end(), "100"), labels.end());
  // y tick labels end at left - 6 = 70; the rotated name's glyphs reach 3 px right of its x.
  const auto names = svg.find("axis-label");
  ASSERT_EQ(names.size(), 2u);
  EXPECT_LT(names[0].number("x") + 3, 70 - widest);
}

TEST(Svg, GanttMergesBarsCloserThanHalfAUnit) {
  Gantt g;
  g.rows = {"stage 0 compute"};
  g.categories = {{"forward", "#111"}};
  g.bars = {{0, 0, 0, 1, "a"}, {0, 0, 1.0001, 2, "b"}, {0, 0, 5, 6, "c"}};
  const Svg svg = gantt(g, 760);
  // Frame width 760 - 170 - 24 = 566 over ticks 0..6 (step 1): half a unit is 3/566 = 0.0053,
  // so the first two (0.0001 apart) merge into [0, 2]; [5, 6] stays apart.
  const auto bars = svg.find("bar s0");
  ASSERT_EQ(bars.size(), 2u);
  EXPECT_DOUBLE_EQ(bars[0].number("x"), 170);
  EXPECT_NEAR(bars[0].number("width"), 2.0 / 6 * 566, 0.01);
  EXPECT_EQ(bars[0].title.substr(0, 11), "2 x forward");
  EXPECT_EQ(bars[1].title, "c");
  EXPECT_NEAR(bars[1].number("x"), 170 + 5.0 / 6 * 566, 0.01);
}

TEST(Svg, ThinningKeepsTheFrontAndOnePointPerCell) {
  // Front (smaller is better on both): (1,5), (2,3), (3,1). With a 2 x 2 grid over x in [1, 3]
  // and y in [1, 5], (2,4) and (3,3) share cell (1, 1): the first is kept.
  const std::vector<std::pair<double, double>> pts = {{1, 5}, {2, 4}, {2, 3}, {3, 3}, {3, 1}};
  EXPECT_EQ(thin_points(pts, 4, 2), (std::vector<std::size_t>{0, 1, 2, 4}));
  EXPECT_EQ(thin_points(pts, 10).size(), pts.size());  // small inputs are kept whole
}

TEST(Svg, ThinningBoundsALargeScatter) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(1, 100);
  std::vector<std::pair<double, double>> pts(100000);
  for (auto& p : pts) p = {u(rng), u(rng)};
  const auto kept = thin_points(pts, 2000);
  EXPECT_LE(kept.size(), 2000u);
  EXPECT_GT(kept.size(), 500u);
  // Every non-dominated point is kept.
  std::vector<bool> in(pts.size(), false);
  for (std::size_t i : kept) in[i] = true;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    bool dominated = false;
    for (std::size_t j = 0; j < pts.size() && !dominated; ++j) {
      dominated = j != i && pts[j].first <= pts[i].first && pts[j].second < pts[i].second;
      dominated |= j != i && pts[j].first < pts[i].first && pts[j].second <= pts[i].second;
    }
    if (!dominated) {
      EXPECT_TRUE(in[i]) << i;
    }
    if (i > 2000) break;  // O(n^2): the first 2000 points are enough
  }
}

TEST(Svg, SerializesWellFormedElements) {
  Svg svg(100, 50, "a & b");
  svg.rect(1, 2, 3, 4, "#fff", "bar", "x < y");
  svg.text(5, 6, "\"quoted\"", "t");
  const std::string s = svg.str();
  EXPECT_NE(s.find("aria-label=\"a &amp; b\""), std::string::npos) << s;
  EXPECT_NE(s.find("<rect class=\"bar\" x=\"1\" y=\"2\" width=\"3\" height=\"4\" fill=\"#fff\"><title>x &lt; y</title></rect>"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find(">&quot;quoted&quot;</text>"), std::string::npos) << s;
  EXPECT_EQ(s.substr(s.size() - 6), "</svg>");
}

}  // namespace

// reports/csv: RFC 4180 quoting (a field with a comma, quote or line break is quoted, quotes doubled).
#include "reports/csv.hpp"

namespace {

TEST(Csv, QuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(trainplan::csv_field("dp8 tp1 pp1"), "dp8 tp1 pp1");
  EXPECT_EQ(trainplan::csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(trainplan::csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(trainplan::csv_field("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(trainplan::csv_row({"x", "1,5", ""}), "x,\"1,5\",\r\n");
}

}  // namespace
